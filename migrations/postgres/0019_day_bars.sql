-- probeok schema: the status page's day bars read every route's daily counts. A daily
-- rollup row carries its latency histogram; this index holds only the counts, so reading
-- 90 days of bars scans a narrow index instead of every daily row and its histogram. It
-- changes only when a daily bucket is written, once per flush per route.
CREATE INDEX rollups_day_counts ON rollups (bucket_start_ms, route_id, kind, count, successes, good)
    WHERE granularity_s = 86400;
