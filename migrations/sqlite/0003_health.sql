-- probeok schema, migration 3: detection's state, so it survives a restart, and its history.
-- Times are integer unix milliseconds (UTC). States are the SPEC strings (UNKNOWN … SWITCHED).

-- Each route's judged state (the detector's `RouteHealth`: state, counters, error window,
-- open incident) as JSON, rewritten in place. `state` repeats the JSON's for people
-- reading the table with sqlite3; the JSON is what is restored.
CREATE TABLE route_health (
    route_id      INTEGER PRIMARY KEY REFERENCES routes (id),
    state         TEXT    NOT NULL,
    health        TEXT    NOT NULL,
    updated_at_ms INTEGER NOT NULL
);

-- Every change of state, with its reason and evidence (observation, baseline, thresholds).
CREATE TABLE transitions (
    id           INTEGER PRIMARY KEY,
    route_id     INTEGER NOT NULL REFERENCES routes (id),
    at_ms        INTEGER NOT NULL,
    from_state   TEXT    NOT NULL,
    to_state     TEXT    NOT NULL,
    reason_code  TEXT    NOT NULL,
    reason_text  TEXT    NOT NULL,
    failure_mode TEXT,
    evidence     TEXT    NOT NULL, -- JSON of `Evidence`
    incident_id  TEXT              -- the incident it opened, changed or closed
);
CREATE INDEX transitions_route_at ON transitions (route_id, at_ms);
CREATE INDEX transitions_incident ON transitions (incident_id) WHERE incident_id IS NOT NULL;

-- DEGRADED or worse until back to NORMAL. `incident` is the JSON of `Incident` without its
-- transitions (those are rows of `transitions` with this incident_id).
CREATE TABLE incidents (
    id            TEXT    PRIMARY KEY,
    route_id      INTEGER NOT NULL REFERENCES routes (id),
    opened_at_ms  INTEGER NOT NULL,
    closed_at_ms  INTEGER,
    peak          TEXT    NOT NULL,
    failure_mode  TEXT,
    incident      TEXT    NOT NULL
);
CREATE INDEX incidents_route_opened ON incidents (route_id, opened_at_ms);
CREATE INDEX incidents_opened ON incidents (opened_at_ms);
