-- probeok schema: detection's baselines as saved state, so a start reads them instead of
-- replaying every route's raw history. Per route and vantage ('' for the monitor's own): a head
-- row (part -1: the all-day window, held samples, the newest outcome learned, the
-- configuration it was learned under) and one row per time-of-day bucket. Bounded by routes ×
-- buckets, whatever the history's length.
CREATE TABLE baseline_parts (
    route     TEXT    NOT NULL,
    vantage   TEXT    NOT NULL,
    part      INTEGER NOT NULL,
    shape     TEXT    NOT NULL,
    newest_ms INTEGER,
    state     BLOB    NOT NULL,
    PRIMARY KEY (route, vantage, part)
) WITHOUT ROWID;
