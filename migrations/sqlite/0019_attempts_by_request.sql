-- probeok schema: one index entry fewer for each metered request. An attempt is looked up by
-- its request (its primary key) and then by route: a request has a handful of attempts at
-- most, so an index on (route, request_pk) bought those lookups nothing, while keeping it
-- cost every request a write at a random place in it.
DROP INDEX IF EXISTS proxy_attempts_route;
