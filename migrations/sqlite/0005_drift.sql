-- probeok schema: regression set runs (drift). One row per run of one set on one route, one
-- row per case with its verdict, length, latency, reported model and bounded answer.
CREATE TABLE drift_runs (
    id            INTEGER PRIMARY KEY,
    route_id      INTEGER NOT NULL REFERENCES routes (id),
    set_name      TEXT    NOT NULL,
    started_at_ms INTEGER NOT NULL,
    passed        INTEGER NOT NULL,
    answered      INTEGER NOT NULL,
    cases         INTEGER NOT NULL
);
CREATE INDEX drift_runs_route_set_at ON drift_runs (route_id, set_name, started_at_ms);
CREATE INDEX drift_runs_at ON drift_runs (started_at_ms);

CREATE TABLE drift_cases (
    run_id             INTEGER NOT NULL REFERENCES drift_runs (id) ON DELETE CASCADE,
    ord                INTEGER NOT NULL,
    case_name          TEXT    NOT NULL,
    passed             INTEGER,          -- NULL: no complete answer (the call failed)
    failures           TEXT    NOT NULL, -- JSON array of {validator, message}
    output_chars       INTEGER NOT NULL,
    latency_ms         REAL    NOT NULL,
    output_tokens      INTEGER,
    model_reported     TEXT,
    system_fingerprint TEXT,
    error              TEXT,
    output             TEXT    NOT NULL,
    PRIMARY KEY (run_id, ord)
) WITHOUT ROWID;
