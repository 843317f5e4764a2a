-- probeok schema, migration 2: probes the scheduler skipped because the previous one of the
-- same route was still running (an overrun), so a gap in the data has a recorded reason.
CREATE TABLE probe_skips (
    id       INTEGER PRIMARY KEY,
    route_id INTEGER NOT NULL REFERENCES routes (id),
    kind     TEXT    NOT NULL CHECK (kind = 'probe' OR kind = 'throughput' OR kind = 'passive'),
    at_ms    INTEGER NOT NULL
);
CREATE INDEX probe_skips_route_at ON probe_skips (route_id, at_ms);
CREATE INDEX probe_skips_at ON probe_skips (at_ms);
