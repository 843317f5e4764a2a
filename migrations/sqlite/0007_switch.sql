-- probeok schema: the switch controller's records (layer 4): every switch, canary stage,
-- abort, return and refused switch, with seed 004's switch_context (trigger, from/to routes,
-- automatic or manual, dwell-until). Kept for good: a few rows per incident.
CREATE TABLE switch_events (
    id             INTEGER PRIMARY KEY,
    serves         TEXT    NOT NULL,
    action         TEXT    NOT NULL,  -- switch | canary_stage | abort | returned | blocked
    at_ms          INTEGER NOT NULL,
    trigger_code   TEXT    NOT NULL,
    from_routes    TEXT    NOT NULL,  -- JSON array of route ids
    to_routes      TEXT    NOT NULL,  -- JSON array of route ids
    automatic      INTEGER NOT NULL,
    dwell_until_ms INTEGER,
    ratio          REAL,
    episode        TEXT,              -- JSON {started_at, duration_s, switches, extra_cost}
    text           TEXT    NOT NULL
);
CREATE INDEX switch_events_at ON switch_events (at_ms);
CREATE INDEX switch_events_serves_at ON switch_events (serves, at_ms);
