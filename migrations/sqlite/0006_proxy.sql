-- probeok schema: the proxy's metering (one row per request, one per attempt) and its
-- idempotency keys (stored answers with an expiry).
CREATE TABLE proxy_requests (
    id                INTEGER PRIMARY KEY,
    request_id        TEXT    NOT NULL,
    serves            TEXT    NOT NULL,
    started_at_ms     INTEGER NOT NULL,
    route             TEXT,              -- the route that answered (or was tried last)
    outcome           TEXT    NOT NULL,  -- ok | client_error | failed | interrupted | rejected
    status            INTEGER NOT NULL,  -- HTTP status returned to the client
    stream            INTEGER NOT NULL,
    attempts          INTEGER NOT NULL,
    fallback_reason   TEXT,
    prompt_tokens     INTEGER,
    completion_tokens INTEGER,
    cost              REAL,
    currency          TEXT,
    latency_ms        REAL    NOT NULL
);
CREATE INDEX proxy_requests_at ON proxy_requests (started_at_ms);

CREATE TABLE proxy_attempts (
    request_pk        INTEGER NOT NULL REFERENCES proxy_requests (id) ON DELETE CASCADE,
    n                 INTEGER NOT NULL,  -- 1-based attempt number
    route             TEXT    NOT NULL,
    reason            TEXT,              -- why the request moved on (NULL: it did not)
    status_class      TEXT    NOT NULL,  -- 2xx 4xx 5xx none
    status            INTEGER,
    ttfb_ms           REAL,
    latency_ms        REAL    NOT NULL,
    prompt_tokens     INTEGER,
    completion_tokens INTEGER,
    cost              REAL,
    outcome           TEXT    NOT NULL,  -- ok | client_error | failed | interrupted | skipped
    PRIMARY KEY (request_pk, n)
) WITHOUT ROWID;
CREATE INDEX proxy_attempts_route ON proxy_attempts (route, request_pk);
CREATE INDEX proxy_attempts_reason ON proxy_attempts (reason, request_pk);

CREATE TABLE idempotency (
    scope_key     TEXT    PRIMARY KEY,   -- sha256(client key) ':' Idempotency-Key
    body_hash     TEXT    NOT NULL,      -- sha256 of the request body
    expires_at_ms INTEGER NOT NULL,
    status        INTEGER NOT NULL,
    headers       TEXT    NOT NULL,      -- JSON object of the headers that matter
    stream        INTEGER NOT NULL,
    body          BLOB    NOT NULL       -- the answer, or the stream's full event sequence
) WITHOUT ROWID;
CREATE INDEX idempotency_expires ON idempotency (expires_at_ms);
