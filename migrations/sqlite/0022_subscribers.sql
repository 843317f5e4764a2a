-- probeok schema: status page subscribers. A visitor subscribes an email address or a webhook
-- URL to public incidents of all routes, one logical model or one provider; nothing is sent to
-- them until the subscription is confirmed (the mailed link, or the webhook echoing a code).
CREATE TABLE subscribers (
    id               INTEGER PRIMARY KEY,
    kind             TEXT    NOT NULL CHECK (kind IN ('email', 'webhook')),
    target           TEXT    NOT NULL,   -- the address or URL: shown to admins only
    scope            TEXT    NOT NULL,   -- '*', 'model:<logical model>' or 'provider:<id>'
    lang             TEXT    NOT NULL,
    secret           TEXT    NOT NULL,   -- a webhook's signing secret; an email's confirmation code
    created_ms       INTEGER NOT NULL,
    confirmed_ms     INTEGER,            -- NULL until confirmed
    failing_since_ms INTEGER,            -- first failed delivery since the last success
    UNIQUE (kind, target, scope)
);

-- Subscription attempts, for the per-client-IP and per-address limits: `ip:<address>` or
-- `to:<SHA-256 of the target>` (so the limit table holds no address), with when.
CREATE TABLE subscriber_attempts (
    key   TEXT    NOT NULL,
    at_ms INTEGER NOT NULL
);
CREATE INDEX subscriber_attempts_key ON subscriber_attempts (key, at_ms);

-- What is to be sent to subscribers, one row per subscriber and message, claimed before each
-- send as the alert outbox's rows are (a monitor pair sends each once).
CREATE TABLE subscriber_outbox (
    id              INTEGER PRIMARY KEY,
    dedup_key       TEXT    NOT NULL UNIQUE,
    subscriber_id   INTEGER NOT NULL,
    body            TEXT    NOT NULL,    -- the notification, JSON
    created_ms      INTEGER NOT NULL,
    status          TEXT    NOT NULL,    -- pending | delivered | dropped
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_ms INTEGER NOT NULL,
    last_error      TEXT,
    done_ms         INTEGER
);
CREATE INDEX subscriber_outbox_due ON subscriber_outbox (status, next_attempt_ms);
