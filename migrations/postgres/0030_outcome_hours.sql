-- probeok schema: closed hours of raw outcomes, packed (see the SQLite migration of the same
-- number). On PostgreSQL raw outcomes stay in their day partitions, dropped whole by
-- retention; this table holds the hours a SQLite store brought along (`migrate-store`), and
-- readers read both.
CREATE TABLE outcome_hours (
    route_id BIGINT NOT NULL REFERENCES routes (id),
    hour_ms  BIGINT NOT NULL,
    count    BIGINT NOT NULL,
    packed   BYTEA  NOT NULL,
    PRIMARY KEY (route_id, hour_ms)
);
CREATE INDEX outcome_hours_hour ON outcome_hours (hour_ms);
