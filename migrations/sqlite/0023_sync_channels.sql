-- probeok schema: gateway channels (new-api / one-api) that probeok itself disabled because
-- their route's weight went to 0. Only these are enabled again when the route returns; a
-- channel disabled by an operator has no row and is never touched.
CREATE TABLE sync_disabled (
    gateway     TEXT    NOT NULL,   -- the gateway's base URL
    channel_id  INTEGER NOT NULL,
    route       TEXT    NOT NULL,   -- the route whose weight 0 disabled it
    disabled_ms INTEGER NOT NULL,
    PRIMARY KEY (gateway, channel_id)
);
