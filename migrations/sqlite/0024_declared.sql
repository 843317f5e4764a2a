-- probeok schema: what providers declare on their own status pages. Component states as last
-- read, and their incidents (one row per incident, updated as it progresses), so the lead time
-- between probeok's incidents and the provider's declarations survives restarts.
CREATE TABLE declared_components (
    page      TEXT    NOT NULL,   -- the status page's URL
    provider  TEXT    NOT NULL,   -- the [[provider]] it belongs to
    component TEXT    NOT NULL,   -- the page's component name
    status    TEXT    NOT NULL,   -- operational, degraded_performance, partial_outage, major_outage, under_maintenance
    since_ms  INTEGER NOT NULL,   -- when probeok first read this status
    PRIMARY KEY (page, component)
);
CREATE TABLE declared_incidents (
    page        TEXT    NOT NULL,
    incident_id TEXT    NOT NULL,   -- the page's own id (Statuspage id, feed entry id)
    provider    TEXT    NOT NULL,
    name        TEXT    NOT NULL,
    status      TEXT    NOT NULL,   -- investigating, identified, monitoring, resolved, postmortem
    impact      TEXT,               -- none, minor, major, critical (Statuspage only)
    declared_ms INTEGER NOT NULL,   -- when the provider published it
    started_ms  INTEGER NOT NULL,   -- when the provider says the impact began (may be backdated)
    resolved_ms INTEGER,
    url         TEXT,
    components  TEXT    NOT NULL,   -- the page's component names it affects, one per line ('' = none named)
    seen_ms     INTEGER NOT NULL,   -- when probeok first read it
    PRIMARY KEY (page, incident_id)
);
CREATE INDEX declared_incidents_by_provider ON declared_incidents (provider, declared_ms);
