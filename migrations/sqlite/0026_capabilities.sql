-- probeok schema: capability probes (`[capability]`): one row per probe of a route's declared
-- `tools` or `json_schema` capability, kept as long as raw outcomes (`retention_days`).
CREATE TABLE capability_results (
    id         INTEGER PRIMARY KEY,
    route      TEXT    NOT NULL,      -- provider/region/model
    capability TEXT    NOT NULL,      -- tools | json_schema
    at_ms      INTEGER NOT NULL,      -- when the probe started
    ok         INTEGER NOT NULL CHECK (ok IN (0, 1)),
    latency_ms INTEGER NOT NULL,
    error      TEXT                   -- why it failed, short; NULL when ok
);
CREATE INDEX capability_results_by_route ON capability_results (route, capability, at_ms);
CREATE INDEX capability_results_by_time ON capability_results (at_ms);
