-- PostgreSQL dialect of migrations/sqlite/0017_idempotency_owners.sql: every client's count
-- of idempotency keys, kept by a trigger, so that a claim checks the client's share with one
-- row read instead of counting the client's keys.
CREATE TABLE idempotency_owners (
    owner TEXT COLLATE "C" PRIMARY KEY,
    keys  BIGINT NOT NULL
);
INSERT INTO idempotency_owners (owner, keys)
    SELECT owner, count(*) FROM idempotency GROUP BY owner;

CREATE FUNCTION idempotency_owner_count() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.owner IS NOT DISTINCT FROM NEW.owner THEN
        RETURN NULL;
    END IF;
    IF TG_OP IN ('DELETE', 'UPDATE') THEN
        UPDATE idempotency_owners SET keys = keys - 1 WHERE owner = OLD.owner;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        INSERT INTO idempotency_owners (owner, keys) VALUES (NEW.owner, 1)
            ON CONFLICT (owner) DO UPDATE SET keys = idempotency_owners.keys + 1;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER idempotency_owner_count AFTER INSERT OR DELETE OR UPDATE OF owner ON idempotency
    FOR EACH ROW EXECUTE FUNCTION idempotency_owner_count();
