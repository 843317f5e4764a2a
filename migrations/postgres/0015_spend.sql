-- PostgreSQL dialect of migrations/sqlite/0013_spend.sql: the same tables, columns and indexes. Append-only.
-- probeok schema: the spend ledger. One row per (ledger key, period start) with what was
-- settled and what running requests have booked, in integer micro-units of the routes' price
-- currency (exact sums, no float drift); one row per open reservation, with an expiry so a
-- proxy that died mid-request does not hold money forever. Ledger keys name what is limited:
-- `client:<id>` (a client's spend limit) or `budget:extra_cost` (the fleet's hourly budget).
CREATE TABLE spend_ledger (
    ledger_key      TEXT COLLATE "C" NOT NULL,
    period_start_ms BIGINT NOT NULL,
    spent_micros    BIGINT NOT NULL DEFAULT 0,
    reserved_micros BIGINT NOT NULL DEFAULT 0,
    refused         BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (ledger_key, period_start_ms)
);

CREATE TABLE spend_reservations (
    id              TEXT COLLATE "C" PRIMARY KEY,
    ledger_key      TEXT COLLATE "C" NOT NULL,
    period_start_ms BIGINT NOT NULL,
    amount_micros   BIGINT NOT NULL,
    expires_at_ms   BIGINT NOT NULL
);
CREATE INDEX spend_reservations_expiry ON spend_reservations (ledger_key, period_start_ms, expires_at_ms);

-- The client (its `[[proxy.client]]` id) a metered request came from.
ALTER TABLE proxy_requests ADD COLUMN client TEXT COLLATE "C";
