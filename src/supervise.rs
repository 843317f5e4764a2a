//! No task dies quietly. Every long-lived task of `serve` and `agent` is spawned through a
//! [`Supervisor`]: when one panics, or ends while the token it runs under still says "keep
//! going", the failure is logged with the task's name and the panic message, counted
//! (`probeok_task_failures_total{task}`), and the supervisor's `fatal` token is cancelled. The
//! process then drains what it can and leaves with a non-zero code, so systemd or Kubernetes
//! restarts it and the other monitor of a pair takes over.
//!
//! No task is restarted in-process: each holds state a restart would silently lose or
//! duplicate (a queue of outcomes, a lease, an outbox claim, a baseline), and a fresh process
//! restores all of it from the store in one known way.
//!
//! Debug builds only: `PROBEOK_FAULT_PANIC=<task>` makes that task panic as it starts, so a
//! test can watch the whole path on the real binary. Release builds have no such hook.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The tasks `probeok serve` supervises, so their failure counters exist at 0.
pub const MONITOR_TASKS: &[&str] = &[
    "web",
    "proxy",
    "haproxy_agent",
    "budget",
    "passive_recorder",
    "vantage_dispatch",
    "recorder",
    "dispatch",
    "terms",
    "heartbeat",
    "detection",
    "alerts",
    "subscribers",
    "scheduler",
    "retention",
    "sync",
    "status_pages",
    "catalog",
];

/// The tasks `probeok agent` supervises.
pub const AGENT_TASKS: &[&str] = &[
    "agent_scheduler",
    "agent_recorder",
    "agent_pusher",
    "agent_web",
];

/// The tasks of `probeok proxy` (the proxy alone).
pub const PROXY_TASKS: &[&str] = &[
    "proxy",
    "proxy_feed",
    "proxy_ingest",
    "proxy_jobs",
    "budget",
];

/// What a task's output says about how it ended.
pub trait Ended {
    /// Why the output is a failure, if it is one.
    fn failure(&self) -> Option<String>;
}

impl Ended for () {
    fn failure(&self) -> Option<String> {
        None
    }
}

impl<E: std::fmt::Display> Ended for Result<(), E> {
    fn failure(&self) -> Option<String> {
        self.as_ref()
            .err()
            .map(|e| format!("ended with an error: {e}"))
    }
}

/// The first task that failed, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub task: &'static str,
    pub reason: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "task {} failed: {}", self.task, self.reason)
    }
}

#[derive(Clone)]
pub struct Supervisor {
    /// The names counted, at 0 until they fail.
    names: &'static [&'static str],
    fatal: CancellationToken,
    inner: Arc<Mutex<Inner>>,
}

#[derive(Default)]
struct Inner {
    first: Option<Failure>,
    counts: BTreeMap<&'static str, u64>,
}

impl Supervisor {
    /// A supervisor of the tasks `names` (the counters it reports).
    pub fn new(names: &'static [&'static str]) -> Self {
        Self {
            names,
            fatal: CancellationToken::new(),
            inner: Arc::default(),
        }
    }

    /// Cancelled by the first failure.
    pub fn fatal(&self) -> CancellationToken {
        self.fatal.clone()
    }

    /// The first failure, once there is one.
    pub fn failure(&self) -> Option<Failure> {
        self.lock().first.clone()
    }

    /// Failures per task, every supervised name included (at 0).
    pub fn counts(&self) -> Vec<(&'static str, u64)> {
        let inner = self.lock();
        self.names
            .iter()
            .map(|t| (*t, inner.counts.get(t).copied().unwrap_or(0)))
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding this lock cannot happen (only plain updates under it); a
        // poisoned lock still holds good counts.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn fail(&self, task: &'static str, reason: String) {
        tracing::error!(task, %reason, "a supervised task failed: the process stops");
        let mut inner = self.lock();
        *inner.counts.entry(task).or_default() += 1;
        inner.first.get_or_insert(Failure { task, reason });
        drop(inner);
        self.fatal.cancel();
    }

    /// Watches the spawned task `handle` as task `name` (see [`Supervisor::spawn`]).
    pub fn watch<T>(
        &self,
        name: &'static str,
        until: CancellationToken,
        handle: JoinHandle<T>,
    ) -> JoinHandle<T>
    where
        T: Ended + Send + 'static,
    {
        let this = self.clone();
        tokio::spawn(async move {
            match handle.await {
                Ok(out) => {
                    if let Some(why) = out.failure() {
                        this.fail(name, why);
                    } else if !until.is_cancelled() {
                        this.fail(name, "ended before it was asked to stop".into());
                    }
                    out
                }
                Err(e) if e.is_panic() => {
                    let payload = e.into_panic();
                    this.fail(name, format!("panicked: {}", panic_message(&*payload)));
                    std::panic::resume_unwind(payload)
                }
                // Cancelled only by the runtime shutting down: nothing to report.
                Err(_) => std::future::pending().await,
            }
        })
    }

    /// Spawns `fut` as task `name`. Ending is expected once `until` is cancelled; before that,
    /// ending (or ending with an error, or panicking) is a failure. The handle yields the
    /// task's output; a panic is passed on to it after being recorded.
    pub fn spawn<T, F>(&self, name: &'static str, until: CancellationToken, fut: F) -> JoinHandle<T>
    where
        T: Ended + Send + 'static,
        F: Future<Output = T> + Send + 'static,
    {
        self.watch(name, until, tokio::spawn(fault(name, fut)))
    }
}

/// The text of a panic's payload (`panic!("…")` gives a `&str` or a `String`).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(a panic without a message)".to_owned()
    }
}

#[cfg(debug_assertions)]
async fn fault<F: Future>(name: &'static str, fut: F) -> F::Output {
    if std::env::var("PROBEOK_FAULT_PANIC").is_ok_and(|t| t == name) {
        panic!("fault injected into {name} (PROBEOK_FAULT_PANIC)");
    }
    fut.await
}

#[cfg(not(debug_assertions))]
async fn fault<F: Future>(_name: &'static str, fut: F) -> F::Output {
    fut.await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panic_is_recorded_with_its_message_and_cancels_fatal() {
        let s = Supervisor::new(MONITOR_TASKS);
        async fn boom() {
            panic!("index out of bounds")
        }
        let h = s.spawn("detection", CancellationToken::new(), boom());
        assert!(
            h.await.unwrap_err().is_panic(),
            "the panic reaches the handle"
        );
        assert!(s.fatal().is_cancelled());
        let f = s.failure().unwrap();
        assert_eq!(f.task, "detection");
        assert_eq!(f.reason, "panicked: index out of bounds");
        assert!(s.counts().contains(&("detection", 1)));
        assert!(s.counts().contains(&("recorder", 0)));
    }

    #[tokio::test]
    async fn ending_early_or_with_an_error_fails_and_ending_when_asked_does_not() {
        let s = Supervisor::new(MONITOR_TASKS);
        let stop = CancellationToken::new();
        stop.cancel();
        s.spawn("web", stop.clone(), async {}).await.unwrap();
        s.spawn("recorder", stop, async {}).await.unwrap();
        assert!(s.failure().is_none(), "asked to stop, ended: fine");

        let keep = CancellationToken::new();
        s.spawn("recorder", keep.clone(), async {}).await.unwrap();
        assert_eq!(
            s.failure().unwrap().reason,
            "ended before it was asked to stop"
        );
        let s = Supervisor::new(MONITOR_TASKS);
        let r = s
            .spawn("web", keep, async {
                Err::<(), _>(std::io::Error::other("address in use"))
            })
            .await
            .unwrap();
        assert!(r.is_err());
        assert_eq!(
            s.failure().unwrap().reason,
            "ended with an error: address in use"
        );
    }
}
