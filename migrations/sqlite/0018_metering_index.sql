-- probeok schema: one index entry fewer for each untraced metered request. Failed requests'
-- trace ids are looked up by time among traced rows only, so their index holds traced rows
-- only; lookups by time alone keep proxy_requests_at.
DROP INDEX IF EXISTS proxy_requests_trace;
CREATE INDEX proxy_requests_traced ON proxy_requests (started_at_ms) WHERE trace_id IS NOT NULL;
