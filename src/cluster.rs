//! The monitor pair: several `probeok serve` on one PostgreSQL database, one of them leading.
//!
//! Leadership is a PostgreSQL advisory lock ([`LOCK_KEY`]) held by a session of its own — not
//! the store's pool — so it lives exactly as long as that connection: a leader killed with
//! `kill -9`, or cut off from the database, loses it when the server notices the session is
//! gone, and a follower trying once a second takes it over. A leader that hangs without
//! dying (stopped, frozen) is ended by the server: the session asks it to end any session
//! silent for the lease (`idle_session_timeout`). The leader asks its session a
//! trivial question every second; a session that fails, or leaves the questions unanswered
//! for `[cluster] lease`, ends the term at once (the member steps down before the server
//! would hand the lock to anyone else, since that session still holds it).
//!
//! The role is published on a [`RoleRx`]; [`terms`] runs the wiring's leader-only and
//! follower-only work one term at a time. With SQLite there is no lease: the monitor is
//! always the leader ([`always_leader`]).

use std::fmt;
use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::secret::Secret;

/// The advisory lock every member of a cluster competes for (one database, one cluster).
pub const LOCK_KEY: i64 = i64::from_be_bytes(*b"probeokL");

/// How often the leader checks its session and a follower tries for the lock.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);

/// The lease session's `application_name`, so operators can find it in `pg_stat_activity`.
pub const APPLICATION_NAME: &str = "probeok lease";

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The URL does not parse; the message never repeats the URL (it holds a password).
    #[error("the database URL in ${var} is not a PostgreSQL URL: {reason}")]
    BadUrl { var: String, reason: String },
}

/// What this member does in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Runs the scheduler, detection, alerts, the switch controller, drills, retention and
    /// regression runs.
    Leader,
    /// Serves what the leader stored: pages, API, weights, metrics, ingest, its proxy.
    Follower,
}

impl Role {
    /// As `/readyz` and `/api/v1/status` say it.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Leader => "leader",
            Role::Follower => "follower",
        }
    }

    pub fn is_leader(self) -> bool {
        self == Role::Leader
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The member's role as it changes.
pub type RoleRx = watch::Receiver<Role>;

/// A role that never changes: the single monitor on SQLite. The sender is kept inside the
/// returned pair so the receiver never reports it closed before the caller drops it.
pub fn always_leader() -> (watch::Sender<Role>, RoleRx) {
    watch::channel(Role::Leader)
}

/// The database the lease is held on: its parsed connection settings and a label safe to
/// log (host and database name, never the user or password).
#[derive(Clone)]
pub struct Target {
    config: tokio_postgres::Config,
    label: String,
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target")
            .field("database", &self.label)
            .finish_non_exhaustive()
    }
}

impl Target {
    /// Parses the URL read from `var` (named in errors instead of the URL itself).
    pub fn parse(var: &str, url: &Secret) -> Result<Target, ClusterError> {
        let config: tokio_postgres::Config =
            url.expose().parse().map_err(|e: tokio_postgres::Error| {
                // The parser's message names the offending parameter, not its value.
                ClusterError::BadUrl {
                    var: var.to_owned(),
                    reason: e.to_string(),
                }
            })?;
        let host = config
            .get_hosts()
            .first()
            .map(|h| match h {
                tokio_postgres::config::Host::Tcp(name) => name.clone(),
                #[cfg(unix)]
                tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
            })
            .unwrap_or_else(|| "localhost".into());
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let db = config.get_dbname().unwrap_or("(default)");
        Ok(Target {
            label: format!("{host}:{port}/{db}"),
            config,
        })
    }

    /// `host:port/database`, for logs.
    pub fn label(&self) -> &str {
        &self.label
    }
}

/// The PostgreSQL URL `[storage] url_env` points at, when that variable holds one. `None`:
/// no cluster (SQLite, or the variable unset or empty).
pub fn database_url(url_env: Option<&str>) -> Option<(String, Secret)> {
    let var = url_env?;
    let url = Secret::from_env(var)?;
    let s = url.expose().trim();
    (s.starts_with("postgres://") || s.starts_with("postgresql://"))
        .then(|| (var.to_owned(), Secret::new(s)))
}

/// The lease's cadences.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseOptions {
    /// A session silent (or failing) this long ends the term.
    pub lease: Duration,
    /// How often the leader checks its session and a follower tries for the lock.
    pub check_every: Duration,
}

impl LeaseOptions {
    pub fn new(lease: Duration) -> Self {
        Self {
            lease,
            check_every: CHECK_EVERY,
        }
    }
}

/// A running lease: the role it publishes, and its task.
pub struct Lease {
    pub role: RoleRx,
    pub task: JoinHandle<()>,
}

/// Competes for leadership on `target` until `stop`; starts as a follower. At `stop` the
/// session is closed, which hands the lock to the next member at once.
pub fn spawn(target: Target, opts: LeaseOptions, stop: CancellationToken) -> Lease {
    let (tx, rx) = watch::channel(Role::Follower);
    let task = tokio::spawn(run(target, opts, tx, stop));
    Lease { role: rx, task }
}

/// A connection of the lease's own, its driver task ended when it is dropped.
struct Session {
    client: tokio_postgres::Client,
    driver: JoinHandle<()>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

async fn connect(target: &Target, opts: &LeaseOptions) -> Result<Session, String> {
    let mut config = target.config.clone();
    config
        .application_name(APPLICATION_NAME)
        .connect_timeout(opts.lease)
        // A peer that vanished without closing (power loss, a cut link) is noticed by the
        // keepalives rather than never.
        .keepalives(true)
        .keepalives_idle(opts.lease.max(Duration::from_secs(1)))
        .keepalives_interval(Duration::from_secs(1))
        .keepalives_retries(3);
    let connecting = config.connect(tokio_postgres::NoTls);
    let (client, connection) = tokio::time::timeout(opts.lease, connecting)
        .await
        .map_err(|_| format!("no answer within {:?}", opts.lease))?
        .map_err(|e| e.to_string())?;
    let driver = tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "lease session ended");
        }
    });
    // A leader that hangs (stopped, frozen by its host, stuck) keeps its connection open —
    // its kernel still answers TCP keepalives — so the server would keep the lock for it
    // forever and the pair would never fail over. The server ends a session that has asked
    // nothing for the lease (PostgreSQL 14 and later); a live member asks every second.
    let idle = opts.lease.max(opts.check_every * 2).as_millis();
    let set = client
        .simple_query(&format!("SET idle_session_timeout = {idle}"))
        .await;
    if let Err(e) = set {
        // Older servers lack the setting: the pair still fails over on a crash or a cut
        // link, not on a hung leader.
        if e.as_db_error().is_none() {
            return Err(e.to_string());
        }
        tracing::warn!(error = %e, "cluster: the server cannot end a hung leader's session (idle_session_timeout needs PostgreSQL 14); a leader that hangs keeps the lead");
    }
    Ok(Session { client, driver })
}

async fn run(target: Target, opts: LeaseOptions, tx: watch::Sender<Role>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(opts.check_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut session: Option<Session> = None;
    let mut last_ok = Instant::now();
    // The last connection problem logged, so a database that stays away is logged once.
    let mut unreachable: Option<String> = None;
    tracing::info!(database = %target.label, lease = ?opts.lease, "cluster: competing for leadership as a follower");
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        if tx.borrow().is_leader() {
            let Some(s) = &session else {
                step_down(&tx, &target, "the lease session is gone");
                continue;
            };
            let budget = opts.lease.saturating_sub(last_ok.elapsed());
            let answer = tokio::select! {
                _ = stop.cancelled() => break,
                a = tokio::time::timeout(budget, s.client.simple_query("SELECT 1")) => a,
            };
            match answer {
                Ok(Ok(_)) => last_ok = Instant::now(),
                Ok(Err(e)) => {
                    session = None;
                    step_down(&tx, &target, &format!("the lease session failed: {e}"));
                }
                Err(_) => {
                    session = None;
                    step_down(
                        &tx,
                        &target,
                        &format!("the lease session was unanswered for {:?}", opts.lease),
                    );
                }
            }
            continue;
        }
        if session.as_ref().is_none_or(|s| s.client.is_closed()) {
            match connect(&target, &opts).await {
                Ok(s) => {
                    if unreachable.take().is_some() {
                        tracing::info!(database = %target.label, "cluster: the database answers again");
                    }
                    session = Some(s);
                }
                Err(e) => {
                    if unreachable.as_deref() != Some(e.as_str()) {
                        tracing::warn!(database = %target.label, error = %e, "cluster: cannot reach the database; trying every second");
                    }
                    unreachable = Some(e);
                    session = None;
                    continue;
                }
            }
        }
        let Some(s) = &session else { continue };
        let tried = tokio::select! {
            _ = stop.cancelled() => break,
            t = tokio::time::timeout(
                opts.lease,
                s.client.query_one("SELECT pg_try_advisory_lock($1)", &[&LOCK_KEY]),
            ) => t,
        };
        match tried {
            Ok(Ok(row)) => match row.try_get::<_, bool>(0) {
                Ok(true) => {
                    last_ok = Instant::now();
                    tx.send_replace(Role::Leader);
                    tracing::info!(database = %target.label, role = "leader", "cluster: this member now leads");
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "cluster: unexpected answer to the lock request");
                    session = None;
                }
            },
            Ok(Err(e)) => {
                tracing::warn!(database = %target.label, error = %e, "cluster: the lock request failed; reconnecting");
                session = None;
            }
            Err(_) => {
                tracing::warn!(database = %target.label, "cluster: the lock request was unanswered; reconnecting");
                session = None;
            }
        }
    }
    // Closing the session releases the lock for the next member at once.
    drop(session);
    if tx.borrow().is_leader() {
        tx.send_replace(Role::Follower);
        tracing::info!(database = %target.label, role = "follower", "cluster: stopped; leadership released");
    }
}

fn step_down(tx: &watch::Sender<Role>, target: &Target, why: &str) {
    tx.send_replace(Role::Follower);
    tracing::warn!(database = %target.label, role = "follower", reason = why, "cluster: this member stepped down");
}

/// Runs one term at a time for as long as `shutdown` is not cancelled: `start(role, token)`
/// for the current role; its token is cancelled when the role changes (or at shutdown) and
/// the term is awaited before the next one starts, so a leader's work has stopped before the
/// member serves as a follower, and the other way round.
///
/// At shutdown `start` is dropped *before* the last term is awaited: senders it keeps for
/// its terms close, so the term's receivers can drain and end.
pub async fn terms<F, Fut>(mut role: RoleRx, shutdown: CancellationToken, start: F)
where
    F: FnMut(Role, CancellationToken) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut start = Some(start);
    loop {
        let current = *role.borrow_and_update();
        let token = shutdown.child_token();
        let Some(f) = start.as_mut() else { return };
        let term = tokio::spawn(f(current, token.clone()));
        // A closed role channel never changes again: the term runs until shutdown.
        let changed = async {
            loop {
                if role.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
                if *role.borrow() != current {
                    return;
                }
                role.borrow_and_update();
            }
        };
        let ended = tokio::select! {
            _ = shutdown.cancelled() => true,
            _ = changed => false,
        };
        if ended {
            start = None;
        }
        token.cancel();
        if let Err(e) = term.await {
            tracing::error!(role = %current, error = %e, "a cluster term panicked");
        }
        if ended {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn the_lock_key_is_fixed() {
        assert_eq!(LOCK_KEY, 0x7072_6f62_656f_6b4c);
        assert_eq!(Role::Leader.as_str(), "leader");
        assert_eq!(Role::Follower.to_string(), "follower");
    }

    #[test]
    fn the_url_is_read_only_when_it_is_postgres() {
        assert!(database_url(None).is_none());
        assert!(database_url(Some("PROBEOK_TEST_CLUSTER_SURELY_UNSET_VAR")).is_none());
    }

    #[test]
    fn the_label_has_host_and_database_but_no_password() {
        let t = Target::parse(
            "DB",
            &Secret::new("postgres://probeok:hunter2@db.example:6543/monitor"),
        )
        .expect("parses");
        assert_eq!(t.label(), "db.example:6543/monitor");
        assert!(!format!("{t:?}").contains("hunter2"));
        let e = Target::parse(
            "DB",
            &Secret::new("postgres://u:hunter2@h/db?sslmode=bogus"),
        )
        .expect_err("bad sslmode");
        let text = e.to_string();
        assert!(text.contains("$DB"), "{text}");
        assert!(!text.contains("hunter2"), "{text}");
    }

    /// Terms follow the role one at a time: each ends (its token cancelled, awaited) before
    /// the next starts, and shutdown ends the last.
    #[tokio::test(start_paused = true)]
    async fn terms_run_one_at_a_time_and_follow_the_role() {
        let (tx, rx) = watch::channel(Role::Follower);
        let log: Arc<Mutex<Vec<String>>> = Arc::default();
        let shutdown = CancellationToken::new();
        let l = log.clone();
        let task = tokio::spawn(terms(rx, shutdown.clone(), move |role, token| {
            let l = l.clone();
            async move {
                l.lock().unwrap().push(format!("start {role}"));
                token.cancelled().await;
                // A slow stop: the next term must wait for it.
                tokio::time::sleep(Duration::from_millis(50)).await;
                l.lock().unwrap().push(format!("stop {role}"));
            }
        }));
        tokio::time::sleep(Duration::from_millis(10)).await;
        tx.send_replace(Role::Leader);
        tokio::time::sleep(Duration::from_millis(100)).await;
        // The same role again is no change.
        tx.send_replace(Role::Leader);
        tokio::time::sleep(Duration::from_millis(100)).await;
        tx.send_replace(Role::Follower);
        tokio::time::sleep(Duration::from_millis(100)).await;
        shutdown.cancel();
        task.await.unwrap();
        assert_eq!(
            *log.lock().unwrap(),
            [
                "start follower",
                "stop follower",
                "start leader",
                "stop leader",
                "start follower",
                "stop follower"
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_role_channel_keeps_the_term_until_shutdown() {
        let (tx, rx) = always_leader();
        drop(tx);
        let shutdown = CancellationToken::new();
        let started = Arc::new(Mutex::new(0));
        let s = started.clone();
        let task = tokio::spawn(terms(rx, shutdown.clone(), move |role, token| {
            assert_eq!(role, Role::Leader);
            *s.lock().unwrap() += 1;
            async move { token.cancelled().await }
        }));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!task.is_finished());
        shutdown.cancel();
        task.await.unwrap();
        assert_eq!(*started.lock().unwrap(), 1);
    }
}
