//! A database of a test's own on the PostgreSQL server `PROBEOK_TEST_PG_URL` names (the
//! cluster tests' lease lives there): created fresh, dropped at the test's end.

use std::sync::atomic::{AtomicU64, Ordering};

/// The server's URL; a clear failure when the variable is unset.
pub fn server_url() -> String {
    std::env::var("PROBEOK_TEST_PG_URL").unwrap_or_else(|_| {
        panic!(
            "PROBEOK_TEST_PG_URL is unset: the cluster tests need a PostgreSQL server, e.g. \
             PROBEOK_TEST_PG_URL=postgres://probeok@127.0.0.1:55432/postgres cargo test --test cluster_pair"
        )
    })
}

pub async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect to PROBEOK_TEST_PG_URL");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

pub struct Db {
    pub name: String,
    pub url: String,
    server: String,
}

static SEQ: AtomicU64 = AtomicU64::new(0);

impl Db {
    pub async fn create() -> Db {
        let server = server_url();
        let name = format!(
            "cluster_t{}_{}_{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed),
            chrono::Utc::now().timestamp_millis() % 1_000_000
        );
        connect(&server)
            .await
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create the test database");
        let url = with_dbname(&server, &name);
        Db { name, url, server }
    }

    pub async fn drop_now(self) {
        let c = connect(&self.server).await;
        let _ = c
            .batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .await;
    }
}

/// `url` with its database replaced (the path after the authority; the query kept).
pub fn with_dbname(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let authority_end = base[scheme_end..]
        .find('/')
        .map_or(base.len(), |i| scheme_end + i);
    let mut out = format!("{}/{db}", &base[..authority_end]);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}
