-- PostgreSQL dialect of migrations/sqlite/0015_observed.sql: the same tables, columns and indexes. Append-only.
-- probeok schema: route observables from real proxy traffic, as rollups (no prompt or answer
-- text). One row per route × bucket (a minute, span_s = 60, or an hour, span_s = 3600) × the
-- process that wrote it (`source`): each proxy owns its rows and rewrites them whole, so many
-- proxies on one database never race on a counter. Readers add the sources up.
CREATE TABLE route_observed (
    span_s        BIGINT NOT NULL,
    bucket_ms     BIGINT NOT NULL,
    route         TEXT COLLATE "C" NOT NULL,
    source        TEXT COLLATE "C" NOT NULL,
    requests      BIGINT NOT NULL,
    ok            BIGINT NOT NULL,
    rate_limited  BIGINT NOT NULL,
    server_error  BIGINT NOT NULL,
    refused       BIGINT NOT NULL,
    checked       BIGINT NOT NULL,
    valid         BIGINT NOT NULL,
    not_checked   BIGINT NOT NULL,
    cost_sum      DOUBLE PRECISION NOT NULL,
    cost_n        BIGINT NOT NULL,
    ttft          BYTEA  NOT NULL,
    tpot          BYTEA  NOT NULL,
    errors        TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (span_s, bucket_ms, route, source)
);
