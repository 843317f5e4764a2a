-- probeok schema: closed hours of raw outcomes, packed. Once an hour has been over for an
-- hour, each route's raw rows of it become one row here (the value's layout is in the store's
-- pack module: columns of flags, offsets and microseconds, a dictionary of texts, deflated),
-- and the raw rows go. Readers read both tables; a late outcome for a packed hour stays raw
-- until the next packing merges it in.
CREATE TABLE outcome_hours (
    route_id INTEGER NOT NULL REFERENCES routes (id),
    hour_ms  INTEGER NOT NULL,
    count    INTEGER NOT NULL,
    packed   BLOB    NOT NULL,
    PRIMARY KEY (route_id, hour_ms)
);
-- Retention removes the oldest hours first.
CREATE INDEX outcome_hours_hour ON outcome_hours (hour_ms);
