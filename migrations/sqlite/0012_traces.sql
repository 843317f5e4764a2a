-- probeok schema: the trace id of each metered request (32 hex digits; NULL when the proxy
-- did not trace it), so a request, its attempts and the incident it fell into can be found in
-- the tracing backend. Incidents list the trace ids of their failed requests through
-- proxy_attempts (route) and started_at_ms; the index keeps that lookup to traced rows.
ALTER TABLE proxy_requests ADD COLUMN trace_id TEXT;
CREATE INDEX proxy_requests_trace ON proxy_requests (started_at_ms, trace_id);
