-- probeok schema: every client's count of idempotency keys, kept by triggers, so that a claim
-- checks the client's share with one row read instead of counting the client's keys (up to
-- `[proxy] idempotency_keys_per_client` of them, on every claim).
CREATE TABLE idempotency_owners (
    owner TEXT PRIMARY KEY,
    keys  INTEGER NOT NULL
);
INSERT INTO idempotency_owners (owner, keys)
    SELECT owner, count(*) FROM idempotency GROUP BY owner;

CREATE TRIGGER idempotency_owner_added AFTER INSERT ON idempotency BEGIN
    INSERT INTO idempotency_owners (owner, keys) VALUES (NEW.owner, 1)
        ON CONFLICT (owner) DO UPDATE SET keys = keys + 1;
END;

CREATE TRIGGER idempotency_owner_removed AFTER DELETE ON idempotency BEGIN
    UPDATE idempotency_owners SET keys = keys - 1 WHERE owner = OLD.owner;
END;

CREATE TRIGGER idempotency_owner_moved AFTER UPDATE OF owner ON idempotency
    WHEN OLD.owner IS NOT NEW.owner BEGIN
    UPDATE idempotency_owners SET keys = keys - 1 WHERE owner = OLD.owner;
    INSERT INTO idempotency_owners (owner, keys) VALUES (NEW.owner, 1)
        ON CONFLICT (owner) DO UPDATE SET keys = keys + 1;
END;
