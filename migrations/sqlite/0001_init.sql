-- probeok schema, migration 1. Shipped migrations are never edited: add a new numbered file.
-- Times are integer unix milliseconds (UTC).
-- CHECKs spell out `a OR b OR c`: SQLite evaluates an `IN` list of 3+ constants by building a
-- temporary table on every insert, which showed up as a fifth of the writer's time.

-- Route ids are interned: each raw row then carries a small integer instead of a ~40-byte
-- `provider/region/model` string, in the table and again in its index.
CREATE TABLE routes (
    id   INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE
);

-- Every outcome (probe, throughput probe, passive request), one row each.
CREATE TABLE outcomes (
    id                 INTEGER PRIMARY KEY,
    route_id           INTEGER NOT NULL REFERENCES routes (id),
    kind               TEXT    NOT NULL CHECK (kind = 'probe' OR kind = 'throughput' OR kind = 'passive'),
    started_at_ms      INTEGER NOT NULL,
    success            INTEGER NOT NULL CHECK (success IN (0, 1)),
    verified           INTEGER CHECK (verified IN (0, 1)),
    ttfb_ms            REAL,
    ttft_ms            REAL,
    total_ms           REAL    NOT NULL,
    output_tokens      INTEGER,
    tokens_estimated   INTEGER NOT NULL CHECK (tokens_estimated IN (0, 1)),
    tokens_per_second  REAL,
    model_reported     TEXT,
    system_fingerprint TEXT,
    http_status        INTEGER,
    error_kind         TEXT,
    error_status       INTEGER,
    error_message      TEXT,
    retry_after_ms     INTEGER,
    answer             TEXT
);
-- "Recent outcomes of a route" and baseline rebuilds.
CREATE INDEX outcomes_route_started ON outcomes (route_id, started_at_ms);
-- Retention deletes the oldest rows first.
CREATE INDEX outcomes_started ON outcomes (started_at_ms);

-- Aggregates maintained by the writer in the same transaction as the raw rows.
-- granularity_s: 300 (kept 48 h), 3600 and 86400 (kept rollup_retention_days).
-- Latency sums are integer microseconds so merging is exact in any order; they and the
-- histogram cover successes only (a failure's duration is not a latency).
CREATE TABLE rollups (
    route_id        INTEGER NOT NULL REFERENCES routes (id),
    granularity_s   INTEGER NOT NULL CHECK (granularity_s = 300 OR granularity_s = 3600 OR granularity_s = 86400),
    bucket_start_ms INTEGER NOT NULL,
    kind            TEXT    NOT NULL CHECK (kind = 'probe' OR kind = 'throughput' OR kind = 'passive'),
    count           INTEGER NOT NULL,
    successes       INTEGER NOT NULL,
    good            INTEGER NOT NULL, -- success and total_ms <= the SLO latency threshold
    verified        INTEGER NOT NULL,
    latency_sum_us  INTEGER NOT NULL,
    ttfb_sum_us     INTEGER NOT NULL,
    ttfb_count      INTEGER NOT NULL,
    tps_sum         REAL    NOT NULL,
    tps_count       INTEGER NOT NULL,
    histogram       BLOB    NOT NULL, -- see src/store/histogram.rs for the encoding
    -- Time before route: the buckets being filled (every route's) share a few pages at the
    -- end of the tree, so a batch's upserts write few pages. Also serves retention.
    PRIMARY KEY (granularity_s, bucket_start_ms, route_id, kind)
) WITHOUT ROWID;
-- Reads by route; only touched when a bucket is created, not on every update.
CREATE INDEX rollups_route ON rollups (route_id, granularity_s, bucket_start_ms);

-- Last sign of life of each scheduled job (for /readyz and stale-heartbeat alerts).
CREATE TABLE heartbeats (
    job   TEXT PRIMARY KEY,
    at_ms INTEGER NOT NULL
) WITHOUT ROWID;

-- Small facts about the store itself (e.g. the last writability check).
CREATE TABLE store_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
