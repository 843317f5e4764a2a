-- probeok schema: the spend ledger. One row per (ledger key, period start) with what was
-- settled and what running requests have booked, in integer micro-units of the routes' price
-- currency (exact sums, no float drift); one row per open reservation, with an expiry so a
-- proxy that died mid-request does not hold money forever. Ledger keys name what is limited:
-- `client:<id>` (a client's spend limit) or `budget:extra_cost` (the fleet's hourly budget).
CREATE TABLE spend_ledger (
    ledger_key      TEXT    NOT NULL,
    period_start_ms INTEGER NOT NULL,
    spent_micros    INTEGER NOT NULL DEFAULT 0,
    reserved_micros INTEGER NOT NULL DEFAULT 0,
    refused         INTEGER NOT NULL DEFAULT 0,  -- reservations refused in this period
    PRIMARY KEY (ledger_key, period_start_ms)
) WITHOUT ROWID;

CREATE TABLE spend_reservations (
    id              TEXT    PRIMARY KEY,
    ledger_key      TEXT    NOT NULL,
    period_start_ms INTEGER NOT NULL,
    amount_micros   INTEGER NOT NULL,
    expires_at_ms   INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX spend_reservations_expiry ON spend_reservations (ledger_key, period_start_ms, expires_at_ms);

-- The client (its `[[proxy.client]]` id) a metered request came from.
ALTER TABLE proxy_requests ADD COLUMN client TEXT;
