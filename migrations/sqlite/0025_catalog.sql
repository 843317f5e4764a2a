-- probeok schema: the providers' model lists as the leader reads them (`[catalog]`), per
-- provider region (its base URL and key variable) and model, and the `retires` notices sent.
CREATE TABLE catalog_models (
    region        TEXT    NOT NULL,   -- the provider region's base URL and key variable
    model         TEXT    NOT NULL,
    first_seen_ms INTEGER NOT NULL,
    last_seen_ms  INTEGER NOT NULL,
    missing       INTEGER NOT NULL,   -- consecutive successful answers that lacked it
    PRIMARY KEY (region, model)
);
-- One row per `model_retiring` warning sent, so a restart does not send it again.
CREATE TABLE catalog_notices (
    route   TEXT    NOT NULL,
    retires TEXT    NOT NULL,         -- YYYY-MM-DD, as configured when it was sent
    days    INTEGER NOT NULL,         -- 30, 7 or 1
    sent_ms INTEGER NOT NULL,
    PRIMARY KEY (route, retires, days)
);
