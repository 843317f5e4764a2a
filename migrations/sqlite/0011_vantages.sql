-- probeok schema: outcomes measured at remote vantages (`probeok agent`). The monitor's own
-- probes stay in `outcomes` (its charts, rollups and error budget are its own vantage's); each
-- remote outcome is kept here once with the vantage that measured it. `uid` is the agent's id
-- for the outcome: a resend after a lost acknowledgement hits the unique index and is counted
-- as a duplicate instead of becoming a second row.
CREATE TABLE vantage_outcomes (
    id                   INTEGER PRIMARY KEY,
    uid                  TEXT    NOT NULL UNIQUE,
    vantage              TEXT    NOT NULL,
    route_id             INTEGER NOT NULL REFERENCES routes (id),
    received_at_ms       INTEGER NOT NULL,
    kind                 TEXT    NOT NULL CHECK (kind = 'probe' OR kind = 'throughput' OR kind = 'passive'),
    started_at_ms        INTEGER NOT NULL,
    success              INTEGER NOT NULL CHECK (success IN (0, 1)),
    verified             INTEGER CHECK (verified IN (0, 1)),
    ttfb_ms              REAL,
    ttft_ms              REAL,
    total_ms             REAL    NOT NULL,
    output_tokens        INTEGER,
    tokens_estimated     INTEGER NOT NULL CHECK (tokens_estimated IN (0, 1)),
    tokens_per_second    REAL,
    model_reported       TEXT,
    system_fingerprint   TEXT,
    http_status          INTEGER,
    error_kind           TEXT,
    error_status         INTEGER,
    error_message        TEXT,
    retry_after_ms       INTEGER,
    answer               TEXT,
    first_answer_ms      REAL,
    max_tokens_exhausted INTEGER NOT NULL CHECK (max_tokens_exhausted IN (0, 1))
);
-- A vantage's baselines of a route (rebuilt at start) and the route page's per-vantage figures.
CREATE INDEX vantage_outcomes_route ON vantage_outcomes (route_id, vantage, started_at_ms);
-- Retention deletes the oldest rows first.
CREATE INDEX vantage_outcomes_started ON vantage_outcomes (started_at_ms);
