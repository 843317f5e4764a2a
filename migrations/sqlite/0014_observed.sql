-- probeok schema: route observables from real proxy traffic, as rollups (no prompt or answer
-- text). One row per route × bucket (a minute, span_s = 60, or an hour, span_s = 3600) × the
-- process that wrote it (`source`): each proxy owns its rows and rewrites them whole, so many
-- proxies on one database never race on a counter. Readers add the sources up.
CREATE TABLE route_observed (
    span_s        INTEGER NOT NULL,
    bucket_ms     INTEGER NOT NULL,
    route         TEXT    NOT NULL,
    source        TEXT    NOT NULL,
    requests      INTEGER NOT NULL,  -- attempts sent to the route
    ok            INTEGER NOT NULL,  -- complete answers (refusals included)
    rate_limited  INTEGER NOT NULL,  -- HTTP 429
    server_error  INTEGER NOT NULL,  -- HTTP 5xx
    refused       INTEGER NOT NULL,  -- content-policy refusals
    checked       INTEGER NOT NULL,  -- structured answers judged
    valid         INTEGER NOT NULL,
    not_checked   INTEGER NOT NULL,  -- structured answers over a bound
    cost_sum      REAL    NOT NULL,  -- cost of the successful answers with a price
    cost_n        INTEGER NOT NULL,
    ttft          BLOB    NOT NULL,  -- src/store/histogram.rs encoding, ms
    tpot          BLOB    NOT NULL,  -- the same encoding, tenths of a ms
    errors        TEXT    NOT NULL,  -- JSON array of up to 3 validity errors (no answer text)
    PRIMARY KEY (span_s, bucket_ms, route, source)
);
