//! Schema migrations: `migrations/NNNN_name.sql`, embedded at build time and applied in order.
//! `PRAGMA user_version` holds how many have been applied. Each runs in its own
//! `BEGIN IMMEDIATE` transaction together with the version bump, so a crash leaves the
//! database at the previous version, and two processes opening at once cannot both apply one.

use rusqlite::{Connection, TransactionBehavior};

use super::StoreError;

/// Every migration, in order. Append only: a shipped file is never edited or reordered.
pub const MIGRATIONS: &[(&str, &str)] = &[
    ("0001_init", include_str!("../../migrations/0001_init.sql")),
    (
        "0002_probe_skips",
        include_str!("../../migrations/0002_probe_skips.sql"),
    ),
    (
        "0003_health",
        include_str!("../../migrations/0003_health.sql"),
    ),
    (
        "0004_alerts",
        include_str!("../../migrations/0004_alerts.sql"),
    ),
    (
        "0005_drift",
        include_str!("../../migrations/0005_drift.sql"),
    ),
    (
        "0006_proxy",
        include_str!("../../migrations/0006_proxy.sql"),
    ),
    (
        "0007_switch",
        include_str!("../../migrations/0007_switch.sql"),
    ),
    (
        "0008_contracts",
        include_str!("../../migrations/0008_contracts.sql"),
    ),
    (
        "0009_drills",
        include_str!("../../migrations/0009_drills.sql"),
    ),
    (
        "0010_first_answer",
        include_str!("../../migrations/0010_first_answer.sql"),
    ),
    (
        "0011_vantages",
        include_str!("../../migrations/0011_vantages.sql"),
    ),
    (
        "0012_traces",
        include_str!("../../migrations/0012_traces.sql"),
    ),
];

/// The schema version this build expects.
pub fn latest_version() -> u32 {
    MIGRATIONS.len() as u32
}

pub fn user_version(conn: &Connection) -> Result<u32, StoreError> {
    Ok(conn.query_row("PRAGMA user_version", [], |r| r.get(0))?)
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
    for (index, (name, sql)) in MIGRATIONS.iter().enumerate().take(target as usize) {
        let version = index as u32 + 1;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
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
        // `version` is a plain integer; PRAGMA takes no bound parameters.
        tx.execute_batch(&format!("PRAGMA user_version = {version}"))
            .map_err(fail)?;
        tx.commit().map_err(fail)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_numbered_in_order() {
        // Strictly increasing file numbers from 0001 (a branch may skip a number another
        // branch holds; the version is the position in this list).
        let mut last = 0;
        for (name, sql) in MIGRATIONS {
            let n: u32 = name[..4].parse().unwrap();
            assert!(n > last && name.as_bytes()[4] == b'_', "{name}");
            last = n;
            assert!(!sql.trim().is_empty());
        }
        assert!(MIGRATIONS[0].0.starts_with("0001_"));
    }

    #[test]
    fn migrate_in_memory_and_refuse_newer() {
        let mut conn = Connection::open_in_memory().unwrap();
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
