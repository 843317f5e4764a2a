-- probeok schema: degradation contracts (layer 3). Which contract behaviour answered a proxy
-- request (fallback_model | async_queue | cached_response | reject), for metering and drill
-- reports. The async-queue jobs and the response cache follow.
ALTER TABLE proxy_requests ADD COLUMN contract TEXT;

-- async_queue: jobs accepted with 202 while their model was degraded, run once it is healthy
-- again (at least once: a job found `running` at start is queued again).
CREATE TABLE contract_jobs (
    id               TEXT    PRIMARY KEY,   -- job_<32 hex>
    owner            TEXT    NOT NULL,      -- sha256(client key) in hex; never the key itself
    feature          TEXT    NOT NULL,
    model            TEXT    NOT NULL,      -- the logical model asked for
    residency        TEXT,                  -- x-probeok-residency of the request
    stream_requested INTEGER NOT NULL,      -- the request asked for a stream; it runs with stream: false
    request          BLOB    NOT NULL,      -- the request body as received
    status           TEXT    NOT NULL,      -- queued | running | succeeded | failed | expired
    runs             INTEGER NOT NULL DEFAULT 0,
    created_at_ms    INTEGER NOT NULL,
    expires_at_ms    INTEGER NOT NULL,      -- not run by then: expired
    started_at_ms    INTEGER,
    finished_at_ms   INTEGER,               -- succeeded, failed or expired at
    result_status    INTEGER,               -- the HTTP status the run got
    result_body      BLOB,                  -- its body, bounded by proxy.max_body
    error            TEXT                   -- why it failed or expired
);
CREATE INDEX contract_jobs_status ON contract_jobs (status, created_at_ms);
CREATE INDEX contract_jobs_finished ON contract_jobs (finished_at_ms);

-- cached_response: the last successful answer per normalized request, feature and client (the
-- key is a SHA-256 over all three, so one client never reads another's answer). Purged after
-- the longest configured max age; read only by the proxy.
CREATE TABLE contract_cache (
    key          TEXT    PRIMARY KEY,
    feature      TEXT    NOT NULL,
    stream       INTEGER NOT NULL,          -- body is the SSE event sequence
    stored_at_ms INTEGER NOT NULL,
    status       INTEGER NOT NULL,
    body         BLOB    NOT NULL
) WITHOUT ROWID;
CREATE INDEX contract_cache_stored ON contract_cache (stored_at_ms);
