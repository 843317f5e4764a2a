-- PostgreSQL dialect of migrations/sqlite/0025_catalog.sql: the same tables, columns and indexes. Append-only.
-- probeok schema: the providers' model lists as the leader reads them (`[catalog]`), per
-- provider region (its base URL and key variable) and model, and the `retires` notices sent.
CREATE TABLE catalog_models (
    region        TEXT COLLATE "C" NOT NULL,
    model         TEXT COLLATE "C" NOT NULL,
    first_seen_ms BIGINT NOT NULL,
    last_seen_ms  BIGINT NOT NULL,
    missing       BIGINT NOT NULL,
    PRIMARY KEY (region, model)
);
-- One row per `model_retiring` warning sent, so a restart does not send it again.
CREATE TABLE catalog_notices (
    route   TEXT COLLATE "C" NOT NULL,
    retires TEXT COLLATE "C" NOT NULL,
    days    BIGINT NOT NULL,
    sent_ms BIGINT NOT NULL,
    PRIMARY KEY (route, retires, days)
);
