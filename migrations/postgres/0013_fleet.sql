-- PostgreSQL dialect of migrations/sqlite/0014_fleet.sql: the same columns and indexes.
-- probeok schema: many proxies on one database. An idempotency key is claimed in the store
-- before its first request runs (a pending row with a lease: another proxy waits for its
-- answer or answers 409), and every client's keys and cached answers are counted against
-- its share (owner: sha256 of the client key, never the key itself). An async job's run is a
-- claim with a lease the running worker renews: a worker that dies leaves the job to be taken
-- again once the lease runs out.
ALTER TABLE idempotency ADD COLUMN owner TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE idempotency ADD COLUMN claimed_until_ms BIGINT;    -- set while the first request runs; NULL once answered
CREATE INDEX idempotency_owner ON idempotency (owner, expires_at_ms);

ALTER TABLE contract_cache ADD COLUMN owner TEXT COLLATE "C" NOT NULL DEFAULT '';
CREATE INDEX contract_cache_owner ON contract_cache (owner, stored_at_ms);

ALTER TABLE contract_jobs ADD COLUMN worker TEXT COLLATE "C";   -- the worker running it
ALTER TABLE contract_jobs ADD COLUMN lease_until_ms BIGINT;     -- its claim holds until then
CREATE INDEX contract_jobs_lease ON contract_jobs (status, lease_until_ms);
