//! Schema migrations, one folder per engine: `migrations/sqlite/NNNN_name.sql` and
//! `migrations/postgres/NNNN_name.sql` (the same tables, columns and indexes in each dialect),
//! embedded at build time and applied in order at open. Both folders are append-only and hold
//! the same versions.
//!
//! SQLite keeps how many have been applied in `PRAGMA user_version`, PostgreSQL in the one
//! row of `probeok_schema`. Each migration runs in its own transaction together with the
//! version bump (both engines have transactional DDL), so a crash leaves the database at the
//! previous version; the transaction holds the write lock (SQLite's `BEGIN IMMEDIATE`, an
//! advisory lock on PostgreSQL) so two processes opening at once cannot both apply one.

use super::sql::{Connection, Engine, SqlError};
use super::StoreError;

/// SQLite's migrations, in order. Append only: a shipped file is never edited or reordered.
pub const MIGRATIONS: &[(&str, &str)] = &[
    (
        "0001_init",
        include_str!("../../migrations/sqlite/0001_init.sql"),
    ),
    (
        "0002_probe_skips",
        include_str!("../../migrations/sqlite/0002_probe_skips.sql"),
    ),
    (
        "0003_health",
        include_str!("../../migrations/sqlite/0003_health.sql"),
    ),
    (
        "0004_alerts",
        include_str!("../../migrations/sqlite/0004_alerts.sql"),
    ),
    (
        "0005_drift",
        include_str!("../../migrations/sqlite/0005_drift.sql"),
    ),
    (
        "0006_proxy",
        include_str!("../../migrations/sqlite/0006_proxy.sql"),
    ),
    (
        "0007_switch",
        include_str!("../../migrations/sqlite/0007_switch.sql"),
    ),
    (
        "0008_contracts",
        include_str!("../../migrations/sqlite/0008_contracts.sql"),
    ),
    (
        "0009_drills",
        include_str!("../../migrations/sqlite/0009_drills.sql"),
    ),
    (
        "0010_first_answer",
        include_str!("../../migrations/sqlite/0010_first_answer.sql"),
    ),
    (
        "0011_vantages",
        include_str!("../../migrations/sqlite/0011_vantages.sql"),
    ),
    (
        "0012_traces",
        include_str!("../../migrations/sqlite/0012_traces.sql"),
    ),
    (
        "0013_fleet",
        include_str!("../../migrations/sqlite/0013_fleet.sql"),
    ),
    (
        "0014_observed",
        include_str!("../../migrations/sqlite/0014_observed.sql"),
    ),
    (
        "0015_spend",
        include_str!("../../migrations/sqlite/0015_spend.sql"),
    ),
    (
        "0016_alert_messages",
        include_str!("../../migrations/sqlite/0016_alert_messages.sql"),
    ),
    (
        "0017_idempotency_owners",
        include_str!("../../migrations/sqlite/0017_idempotency_owners.sql"),
    ),
    (
        "0018_metering_index",
        include_str!("../../migrations/sqlite/0018_metering_index.sql"),
    ),
    (
        "0019_attempts_by_request",
        include_str!("../../migrations/sqlite/0019_attempts_by_request.sql"),
    ),
    (
        "0022_subscribers",
        include_str!("../../migrations/sqlite/0022_subscribers.sql"),
    ),
    (
        "0023_sync_channels",
        include_str!("../../migrations/sqlite/0023_sync_channels.sql"),
    ),
    (
        "0024_declared",
        include_str!("../../migrations/sqlite/0024_declared.sql"),
    ),
    (
        "0025_catalog",
        include_str!("../../migrations/sqlite/0025_catalog.sql"),
    ),
    (
        "0026_capabilities",
        include_str!("../../migrations/sqlite/0026_capabilities.sql"),
    ),
    (
        "0027_embedding_references",
        include_str!("../../migrations/sqlite/0027_embedding_references.sql"),
    ),
    (
        "0028_baseline_parts",
        include_str!("../../migrations/sqlite/0028_baseline_parts.sql"),
    ),
    (
        "0029_outcome_days",
        include_str!("../../migrations/sqlite/0029_outcome_days.sql"),
    ),
    (
        "0030_outcome_hours",
        include_str!("../../migrations/sqlite/0030_outcome_hours.sql"),
    ),
];

/// PostgreSQL's, the same versions in its dialect.
pub const PG_MIGRATIONS: &[(&str, &str)] = &[
    (
        "0001_init",
        include_str!("../../migrations/postgres/0001_init.sql"),
    ),
    (
        "0002_probe_skips",
        include_str!("../../migrations/postgres/0002_probe_skips.sql"),
    ),
    (
        "0003_health",
        include_str!("../../migrations/postgres/0003_health.sql"),
    ),
    (
        "0004_alerts",
        include_str!("../../migrations/postgres/0004_alerts.sql"),
    ),
    (
        "0005_drift",
        include_str!("../../migrations/postgres/0005_drift.sql"),
    ),
    (
        "0006_proxy",
        include_str!("../../migrations/postgres/0006_proxy.sql"),
    ),
    (
        "0007_switch",
        include_str!("../../migrations/postgres/0007_switch.sql"),
    ),
    (
        "0008_contracts",
        include_str!("../../migrations/postgres/0008_contracts.sql"),
    ),
    (
        "0009_drills",
        include_str!("../../migrations/postgres/0009_drills.sql"),
    ),
    (
        "0010_first_answer",
        include_str!("../../migrations/postgres/0010_first_answer.sql"),
    ),
    (
        "0011_vantages",
        include_str!("../../migrations/postgres/0011_vantages.sql"),
    ),
    (
        "0012_traces",
        include_str!("../../migrations/postgres/0012_traces.sql"),
    ),
    (
        "0013_fleet",
        include_str!("../../migrations/postgres/0013_fleet.sql"),
    ),
    (
        "0014_observed",
        include_str!("../../migrations/postgres/0014_observed.sql"),
    ),
    (
        "0015_spend",
        include_str!("../../migrations/postgres/0015_spend.sql"),
    ),
    (
        "0016_alert_messages",
        include_str!("../../migrations/postgres/0016_alert_messages.sql"),
    ),
    (
        "0017_idempotency_owners",
        include_str!("../../migrations/postgres/0017_idempotency_owners.sql"),
    ),
    (
        "0018_metering_index",
        include_str!("../../migrations/postgres/0018_metering_index.sql"),
    ),
    (
        "0019_attempts_by_request",
        include_str!("../../migrations/postgres/0019_attempts_by_request.sql"),
    ),
    (
        "0022_subscribers",
        include_str!("../../migrations/postgres/0022_subscribers.sql"),
    ),
    (
        "0023_sync_channels",
        include_str!("../../migrations/postgres/0023_sync_channels.sql"),
    ),
    (
        "0024_declared",
        include_str!("../../migrations/postgres/0024_declared.sql"),
    ),
    (
        "0025_catalog",
        include_str!("../../migrations/postgres/0025_catalog.sql"),
    ),
    (
        "0026_capabilities",
        include_str!("../../migrations/postgres/0026_capabilities.sql"),
    ),
    (
        "0027_embedding_references",
        include_str!("../../migrations/postgres/0027_embedding_references.sql"),
    ),
    (
        "0028_baseline_parts",
        include_str!("../../migrations/postgres/0028_baseline_parts.sql"),
    ),
    (
        "0029_outcome_days",
        include_str!("../../migrations/postgres/0029_outcome_days.sql"),
    ),
    (
        "0030_outcome_hours",
        include_str!("../../migrations/postgres/0030_outcome_hours.sql"),
    ),
];

/// The advisory lock key migrations take on PostgreSQL ("probeok" and 1 in its bytes).
const PG_MIGRATION_LOCK: i64 = 0x7072_6f62_656f_6b01;

/// The schema version this build expects.
pub fn latest_version() -> u32 {
    MIGRATIONS.len() as u32
}

fn migrations(engine: Engine) -> &'static [(&'static str, &'static str)] {
    match engine {
        Engine::Sqlite => MIGRATIONS,
        Engine::Postgres => PG_MIGRATIONS,
    }
}

/// How many migrations the database has applied.
pub fn user_version(conn: &Connection) -> Result<u32, StoreError> {
    match conn.engine() {
        Engine::Sqlite => Ok(conn.query_row("PRAGMA user_version", [], |r| r.get(0))?),
        Engine::Postgres => {
            let exists: bool = conn.query_row(
                "SELECT CASE WHEN to_regclass('probeok_schema') IS NULL THEN 0 ELSE 1 END",
                [],
                |r| r.get(0),
            )?;
            if !exists {
                return Ok(0);
            }
            let v: Option<u32> = conn.query_row(
                "SELECT CAST(MAX(version) AS BIGINT) FROM probeok_schema",
                [],
                |r| r.get(0),
            )?;
            Ok(v.unwrap_or(0))
        }
    }
}

/// Sets the version (inside the migration's transaction).
fn set_version(conn: &Connection, version: u32) -> Result<(), SqlError> {
    match conn.engine() {
        // `version` is a plain integer; PRAGMA takes no bound parameters.
        Engine::Sqlite => conn.execute_batch(&format!("PRAGMA user_version = {version}")),
        Engine::Postgres => {
            conn.execute("DELETE FROM probeok_schema", [])?;
            conn.execute(
                "INSERT INTO probeok_schema (version) VALUES (?1)",
                [version],
            )?;
            Ok(())
        }
    }
}

/// Applies every pending migration.
pub fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    migrate_to(conn, latest_version())
}

/// Applies pending migrations up to version `target` (1-based). Tests use it to build a
/// database as an older release left it; production calls [`migrate`].
#[doc(hidden)]
pub fn migrate_to(conn: &mut Connection, target: u32) -> Result<(), StoreError> {
    let latest = latest_version();
    if target > latest {
        return Err(StoreError::SchemaTooNew {
            found: target,
            known: latest,
        });
    }
    let engine = conn.engine();
    for (index, (name, sql)) in migrations(engine).iter().enumerate().take(target as usize) {
        let version = index as u32 + 1;
        let tx = conn.transaction()?;
        if engine == Engine::Postgres {
            tx.query_row(
                "SELECT pg_advisory_xact_lock(?1)",
                [PG_MIGRATION_LOCK],
                |_| Ok(()),
            )?;
            tx.execute_batch(
                "CREATE TABLE IF NOT EXISTS probeok_schema (version BIGINT NOT NULL)",
            )?;
        }
        // Read inside the write lock: another process may have migrated meanwhile.
        let current = user_version(&tx)?;
        if current > latest {
            return Err(StoreError::SchemaTooNew {
                found: current,
                known: latest,
            });
        }
        if current >= version {
            continue;
        }
        let fail = |source| StoreError::Migration {
            version,
            name: (*name).to_owned(),
            source,
        };
        tx.execute_batch(sql).map_err(fail)?;
        set_version(&tx, version).map_err(fail)?;
        tx.commit().map_err(fail)?;
    }
    Ok(())
}

/// Sets the recorded version without migrating (tests: a database "from a newer build").
#[doc(hidden)]
pub fn force_version(conn: &Connection, version: u32) -> Result<(), StoreError> {
    if conn.engine() == Engine::Postgres {
        conn.execute_batch("CREATE TABLE IF NOT EXISTS probeok_schema (version BIGINT NOT NULL)")?;
    }
    Ok(set_version(conn, version)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_numbered_in_order_in_both_dialects() {
        // Strictly increasing file numbers from 0001 (a branch may skip a number another
        // branch holds; the version is the position in this list).
        for list in [MIGRATIONS, PG_MIGRATIONS] {
            let mut last = 0;
            for (name, sql) in list {
                let n: u32 = name[..4].parse().unwrap();
                assert!(n > last && name.as_bytes()[4] == b'_', "{name}");
                last = n;
                assert!(!sql.trim().is_empty());
            }
            assert!(list[0].0.starts_with("0001_"));
        }
        let names = |l: &[(&str, &str)]| l.iter().map(|(n, _)| n.to_string()).collect::<Vec<_>>();
        assert_eq!(
            names(MIGRATIONS),
            names(PG_MIGRATIONS),
            "both engines, the same versions"
        );
    }

    #[test]
    fn both_folders_hold_the_same_versions_and_every_file_is_embedded() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
        let list = |engine: &str| {
            let mut v: Vec<String> = std::fs::read_dir(dir.join(engine))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".sql"))
                .map(|n| n.trim_end_matches(".sql").to_owned())
                .collect();
            v.sort();
            v
        };
        let embedded: Vec<String> = MIGRATIONS.iter().map(|(n, _)| n.to_string()).collect();
        assert_eq!(list("sqlite"), embedded);
        assert_eq!(list("postgres"), embedded);
    }

    #[test]
    fn migrate_in_memory_and_refuse_newer() {
        let mut conn = Connection::from_sqlite(rusqlite::Connection::open_in_memory().unwrap());
        migrate_to(&mut conn, 1).unwrap();
        assert_eq!(user_version(&conn).unwrap(), 1);
        migrate(&mut conn).unwrap();
        assert_eq!(user_version(&conn).unwrap(), latest_version());
        conn.execute_batch("PRAGMA user_version = 99").unwrap();
        assert!(matches!(
            migrate(&mut conn),
            Err(StoreError::SchemaTooNew { found: 99, .. })
        ));
    }
}
