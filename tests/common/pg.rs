//! The store on both engines: a fresh SQLite file or a fresh PostgreSQL database per test,
//! and [`on_both_engines!`], which runs one test body on each.
//!
//! PostgreSQL comes from `PROBEOK_TEST_PG_URL` (`scripts/test` starts a server and sets it).
//! Without it the PostgreSQL half of a test fails, saying so: it never passes silently.
//! Each test gets its own database, named after the URL's database (`<db>_<pid>_<n>`), and
//! drops it when done.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use probeok::store::sql::{Connection, Engine, PgUrl};
use probeok::store::{Store, StoreError, StoreLocation, StoreOptions};

/// The variable naming the test server.
pub const URL_VAR: &str = "PROBEOK_TEST_PG_URL";

/// The server's URL from [`URL_VAR`].
pub fn server_url() -> PgUrl {
    let value = std::env::var(URL_VAR).unwrap_or_else(|_| {
        panic!(
            "{URL_VAR} is not set: the PostgreSQL half of the store tests needs a server. \
             Run the suite with scripts/test (it starts one), or set {URL_VAR} to \
             postgres://user@host:port/db of a server where that user may create databases."
        )
    });
    match PgUrl::parse(&value) {
        Some(Ok(url)) => url,
        Some(Err(e)) => panic!("{URL_VAR}: {e}"),
        None => panic!("{URL_VAR} must be a postgres:// URL"),
    }
}

/// A session on the server's own database, for creating, dropping and meddling.
pub fn admin() -> Connection {
    let url = server_url();
    Connection::open_postgres(&url)
        .unwrap_or_else(|e| panic!("{URL_VAR} ({}): {e}", url.describe()))
}

/// A new empty database on the test server; its URL. Dropped with [`PgDatabase`].
pub fn fresh_database() -> PgDatabase {
    static N: AtomicU32 = AtomicU32::new(0);
    let server = server_url();
    let base = server.database().to_owned();
    let name = format!(
        "{base}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    let admin = admin();
    admin
        .execute_batch(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .unwrap();
    admin
        .execute_batch(&format!("CREATE DATABASE {name}"))
        .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e}"));
    PgDatabase {
        url: server.with_database(&name),
        name,
    }
}

/// A test database; dropped (with any session still on it) when this is.
pub struct PgDatabase {
    pub url: PgUrl,
    pub name: String,
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        if let Ok(admin) = Connection::open_postgres(&server_url()) {
            let _ = admin.execute_batch(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ));
        }
    }
}

/// A fresh store location on one engine.
pub struct TestDb {
    pub engine: Engine,
    dir: tempfile::TempDir,
    pg: Option<PgDatabase>,
}

impl TestDb {
    pub fn new(engine: Engine) -> TestDb {
        TestDb {
            engine,
            dir: tempfile::tempdir().unwrap(),
            pg: (engine == Engine::Postgres).then(fresh_database),
        }
    }

    /// The SQLite file (also the path a PostgreSQL store ignores).
    pub fn path(&self) -> PathBuf {
        self.dir.path().join("probeok.db")
    }

    /// A folder for the test's other files.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    pub fn location(&self) -> StoreLocation {
        match &self.pg {
            Some(db) => StoreLocation::Postgres(db.url.clone()),
            None => StoreLocation::Sqlite(self.path()),
        }
    }

    pub fn try_open(&self, opts: StoreOptions) -> Result<Store, StoreError> {
        Store::open_at(&self.location(), opts)
    }

    pub fn open(&self, opts: StoreOptions) -> Store {
        self.try_open(opts).unwrap()
    }

    /// A plain read-write connection (not migrated by itself).
    pub fn connect(&self) -> Connection {
        self.location().connect().unwrap()
    }

    /// The PostgreSQL database's name (`None` on SQLite).
    pub fn pg_name(&self) -> Option<&str> {
        self.pg.as_ref().map(|d| d.name.as_str())
    }

    pub fn is_postgres(&self) -> bool {
        self.engine == Engine::Postgres
    }
}

/// Runs one async test body on SQLite and on PostgreSQL, as `name::sqlite` and
/// `name::postgres`:
///
/// ```ignore
/// on_both_engines! {
///     #[tokio::test]
///     async fn writes_land(db: &TestDb) { let store = db.open(opts()); … }
/// }
/// ```
#[macro_export]
macro_rules! on_both_engines {
    ($(#[$attr:meta] async fn $name:ident($db:ident: &TestDb) $body:block)*) => {$(
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            async fn body($db: &TestDb) $body

            #[$attr]
            async fn sqlite() {
                body(&TestDb::new(probeok::store::sql::Engine::Sqlite)).await
            }

            #[$attr]
            async fn postgres() {
                body(&TestDb::new(probeok::store::sql::Engine::Postgres)).await
            }
        }
    )*};
}
