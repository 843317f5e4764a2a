-- PostgreSQL dialect of migrations/sqlite/0008_contracts.sql: the same tables, columns and indexes (BIGINT,
-- DOUBLE PRECISION, byte-ordered TEXT as SQLite compares it, BYTEA). Append-only, like its twin.
-- probeok schema: degradation contracts (layer 3). Which contract behaviour answered a proxy
-- request (fallback_model | async_queue | cached_response | reject), for metering and drill
-- reports. The async-queue jobs and the response cache follow.
ALTER TABLE proxy_requests ADD COLUMN contract TEXT COLLATE "C";

-- async_queue: jobs accepted with 202 while their model was degraded, run once it is healthy
-- again (at least once: a job found `running` at start is queued again).
CREATE TABLE contract_jobs (
    id               TEXT COLLATE "C"    PRIMARY KEY,   -- job_<32 hex>
    owner            TEXT COLLATE "C"    NOT NULL,      -- sha256(client key) in hex; never the key itself
    feature          TEXT COLLATE "C"    NOT NULL,
    model            TEXT COLLATE "C"    NOT NULL,      -- the logical model asked for
    residency        TEXT COLLATE "C",                  -- x-probeok-residency of the request
    stream_requested BIGINT NOT NULL,      -- the request asked for a stream; it runs with stream: false
    request          BYTEA    NOT NULL,      -- the request body as received
    status           TEXT COLLATE "C"    NOT NULL,      -- queued | running | succeeded | failed | expired
    runs             BIGINT NOT NULL DEFAULT 0,
    created_at_ms    BIGINT NOT NULL,
    expires_at_ms    BIGINT NOT NULL,      -- not run by then: expired
    started_at_ms    BIGINT,
    finished_at_ms   BIGINT,               -- succeeded, failed or expired at
    result_status    BIGINT,               -- the HTTP status the run got
    result_body      BYTEA,                  -- its body, bounded by proxy.max_body
    error            TEXT COLLATE "C"                   -- why it failed or expired
);
CREATE INDEX contract_jobs_status ON contract_jobs (status, created_at_ms);
CREATE INDEX contract_jobs_finished ON contract_jobs (finished_at_ms);

-- cached_response: the last successful answer per normalized request, feature and client (the
-- key is a SHA-256 over all three, so one client never reads another's answer). Purged after
-- the longest configured max age; read only by the proxy.
CREATE TABLE contract_cache (
    key          TEXT COLLATE "C"    PRIMARY KEY,
    feature      TEXT COLLATE "C"    NOT NULL,
    stream       BIGINT NOT NULL,          -- body is the SSE event sequence
    stored_at_ms BIGINT NOT NULL,
    status       BIGINT NOT NULL,
    body         BYTEA    NOT NULL
);
CREATE INDEX contract_cache_stored ON contract_cache (stored_at_ms);
