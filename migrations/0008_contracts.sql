-- probeok schema: degradation contracts (layer 3). Which contract behaviour answered a proxy
-- request (fallback_model | async_queue | cached_response | reject), for metering and drill
-- reports. The async-queue jobs and the response cache follow.
ALTER TABLE proxy_requests ADD COLUMN contract TEXT;
