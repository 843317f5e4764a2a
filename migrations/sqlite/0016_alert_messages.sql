-- probeok schema: a grouped alert's message is stored once. A provider-wide message lists every
-- route it groups, and each of those routes keeps its own firing row; with the message in
-- every row the table grew as routes². Now the rows name their message by digest and the
-- message text lives once in alert_messages (deleted with its last row).

-- One firing message, JSON, under the SHA-256 hex of its text (`moved:<first key>` for the
-- messages this migration moves out of alert_state).
CREATE TABLE alert_messages (
    digest  TEXT PRIMARY KEY,
    message TEXT NOT NULL
);

INSERT INTO alert_messages (digest, message)
    SELECT 'moved:' || min(key), message FROM alert_state GROUP BY message;

ALTER TABLE alert_state ADD COLUMN digest TEXT NOT NULL DEFAULT '';
UPDATE alert_state SET digest =
    (SELECT m.digest FROM alert_messages m WHERE m.message = alert_state.message);
ALTER TABLE alert_state DROP COLUMN message;
-- Which rows still hold a message (so its last one deletes it).
CREATE INDEX alert_state_digest ON alert_state (digest);
