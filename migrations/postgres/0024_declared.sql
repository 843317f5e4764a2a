-- PostgreSQL dialect of migrations/sqlite/0024_declared.sql: the same tables, columns and indexes. Append-only.
-- probeok schema: what providers declare on their own status pages. Component states as last
-- read, and their incidents (one row per incident, updated as it progresses), so the lead time
-- between probeok's incidents and the provider's declarations survives restarts.
CREATE TABLE declared_components (
    page      TEXT COLLATE "C" NOT NULL,
    provider  TEXT COLLATE "C" NOT NULL,
    component TEXT COLLATE "C" NOT NULL,
    status    TEXT COLLATE "C" NOT NULL,
    since_ms  BIGINT NOT NULL,
    PRIMARY KEY (page, component)
);
CREATE TABLE declared_incidents (
    page        TEXT COLLATE "C" NOT NULL,
    incident_id TEXT COLLATE "C" NOT NULL,
    provider    TEXT COLLATE "C" NOT NULL,
    name        TEXT NOT NULL,
    status      TEXT COLLATE "C" NOT NULL,
    impact      TEXT COLLATE "C",
    declared_ms BIGINT NOT NULL,
    started_ms  BIGINT NOT NULL,
    resolved_ms BIGINT,
    url         TEXT,
    components  TEXT NOT NULL,
    seen_ms     BIGINT NOT NULL,
    PRIMARY KEY (page, incident_id)
);
CREATE INDEX declared_incidents_by_provider ON declared_incidents (provider, declared_ms);
