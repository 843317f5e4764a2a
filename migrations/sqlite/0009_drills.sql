-- probeok schema: drills (seed 004), planned time-limited traffic moves with their reports.
-- One row per drill: what was asked (route, target weight, ramp, reason, who, forced), its
-- window, how it ended (auto at its end time, or stop: who and when) and the routes that took
-- its traffic (for the report). Kept for good: a few rows per drill.
CREATE TABLE drills (
    id            INTEGER PRIMARY KEY,
    route         TEXT    NOT NULL,
    serves        TEXT    NOT NULL,
    target_weight INTEGER NOT NULL CHECK (target_weight BETWEEN 0 AND 100),
    ramp          TEXT    NOT NULL,  -- JSON array of percentages, strictly increasing, ending at 100
    reason        TEXT    NOT NULL,
    started_by    TEXT,
    forced        INTEGER NOT NULL CHECK (forced IN (0, 1)),
    started_at_ms INTEGER NOT NULL,
    ends_at_ms    INTEGER NOT NULL,
    ended_at_ms   INTEGER,
    ended_by      TEXT CHECK (ended_by IS NULL OR ended_by = 'auto' OR ended_by = 'stop'),
    stopped_by    TEXT,              -- who asked for the stop, when they said
    receivers     TEXT    NOT NULL DEFAULT '[]'  -- JSON array of route ids that took its traffic
);
CREATE INDEX drills_started ON drills (started_at_ms);
-- At most one active drill per route, whatever the service's memory says.
CREATE UNIQUE INDEX drills_active_route ON drills (route) WHERE ended_at_ms IS NULL;
