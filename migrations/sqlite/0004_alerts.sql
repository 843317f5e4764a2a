-- probeok schema: alerts. Shipped migrations are never edited: add a new numbered file.
-- Times are integer unix milliseconds (UTC).

-- Every message for every channel, written before it is sent (at-least-once delivery).
-- dedup_key = `<message key>#<channel>`: enqueueing the same alert twice is a no-op, and a
-- delivered row stays (until pruned) so a restart cannot send it again.
CREATE TABLE alert_outbox (
    id              INTEGER PRIMARY KEY,
    dedup_key       TEXT    NOT NULL UNIQUE,
    channel         TEXT    NOT NULL,
    message         TEXT    NOT NULL, -- JSON of alert::Message, rendered at send time
    created_ms      INTEGER NOT NULL,
    status          TEXT    NOT NULL CHECK (status = 'pending' OR status = 'delivered' OR status = 'dropped'),
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_ms INTEGER NOT NULL,
    last_error      TEXT,             -- never holds a URL, token or secret
    done_ms         INTEGER
);
-- The sender's question: what is due now?
CREATE INDEX alert_outbox_due ON alert_outbox (status, next_attempt_ms);

-- Alerts currently firing (so a resolved message follows after a restart, and reminders).
CREATE TABLE alert_state (
    key       TEXT PRIMARY KEY,
    message   TEXT    NOT NULL, -- the firing message, JSON
    opened_ms INTEGER NOT NULL
) WITHOUT ROWID;

-- Silences from the admin API.
CREATE TABLE alert_silences (
    id         TEXT PRIMARY KEY,
    routes     TEXT    NOT NULL, -- JSON array of globs
    starts_ms  INTEGER NOT NULL,
    ends_ms    INTEGER NOT NULL,
    comment    TEXT    NOT NULL,
    created_by TEXT    NOT NULL,
    created_ms INTEGER NOT NULL
) WITHOUT ROWID;
