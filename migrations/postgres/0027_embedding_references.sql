-- PostgreSQL dialect of migrations/sqlite/0027_embedding_references.sql: the same tables, columns and indexes. Append-only.
-- probeok schema: each embeddings route's reference vector (its first good one, or the one an
-- admin chose after an intended model change) and its latest good vector, both as
-- little-endian f32 bytes. Later probes are compared with the reference.
CREATE TABLE embedding_references (
    route        TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    reference    BYTEA  NOT NULL,
    reference_ms BIGINT NOT NULL,
    latest       BYTEA  NOT NULL,
    latest_ms    BIGINT NOT NULL
);
