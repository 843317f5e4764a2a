-- probeok schema: each embeddings route's reference vector (its first good one, or the one an
-- admin chose after an intended model change) and its latest good vector, both as
-- little-endian f32 bytes. Later probes are compared with the reference.
CREATE TABLE embedding_references (
    route        TEXT    NOT NULL PRIMARY KEY,
    reference    BLOB    NOT NULL,
    reference_ms INTEGER NOT NULL,
    latest       BLOB    NOT NULL,
    latest_ms    INTEGER NOT NULL
);
