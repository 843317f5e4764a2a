-- PostgreSQL dialect of migrations/sqlite/0018_metering_index.sql: the same indexes. Append-only.
-- probeok schema: fewer index entries for each metered request. Failed requests' trace ids
-- are looked up by time among traced rows only, and attempts by the reason the request moved
-- on among attempts it moved on from: each of those indexes holds only such rows. Lookups by
-- time alone keep proxy_requests_at.
DROP INDEX IF EXISTS proxy_requests_trace;
CREATE INDEX proxy_requests_traced ON proxy_requests (started_at_ms) WHERE trace_id IS NOT NULL;
DROP INDEX IF EXISTS proxy_attempts_reason;
CREATE INDEX proxy_attempts_reason ON proxy_attempts (reason, request_pk) WHERE reason IS NOT NULL;
