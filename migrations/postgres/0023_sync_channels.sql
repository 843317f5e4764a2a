-- PostgreSQL dialect of migrations/sqlite/0023_sync_channels.sql: the same tables, columns and indexes. Append-only.
-- probeok schema: gateway channels (new-api / one-api) that probeok itself disabled because
-- their route's weight went to 0. Only these are enabled again when the route returns; a
-- channel disabled by an operator has no row and is never touched.
CREATE TABLE sync_disabled (
    gateway     TEXT COLLATE "C" NOT NULL,
    channel_id  BIGINT NOT NULL,
    route       TEXT COLLATE "C" NOT NULL,
    disabled_ms BIGINT NOT NULL,
    PRIMARY KEY (gateway, channel_id)
);
