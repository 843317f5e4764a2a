//! The health service's persister: every write the detection loop asks for, in order, on a
//! task of its own so the loop never waits on the store; and the periodic save of the states
//! that changed.

use std::sync::atomic::Ordering;

use tokio::sync::mpsc;

use super::warm::OWN;
use super::{HealthService, Incident, Persist, RouteHealth, Transition, HEARTBEAT_JOB, SAVE_CHUNK};
use crate::store::baselines::SavedBaseline;
use crate::store::Writer;

pub(super) async fn send(persist: &mpsc::Sender<Persist>, p: Persist) {
    if persist.send(p).await.is_err() {
        tracing::error!("the health persister has stopped; a state change is not saved");
    }
}

/// Writes in order; a failed write is logged with what it was, and the next one is tried.
/// Transitions already queued together go in one transaction (retried one by one if it
/// fails), so a mass event costs a few commits, not one per route.
pub(super) async fn persist_loop(writer: Writer, mut rx: mpsc::Receiver<Persist>) {
    let mut next = None;
    loop {
        let p = match next.take() {
            Some(p) => p,
            None => match rx.recv().await {
                Some(p) => p,
                None => return,
            },
        };
        match p {
            Persist::Transition {
                transition,
                incident,
                health,
            } => {
                let mut batch = vec![(transition, incident, health)];
                while batch.len() < TRANSITION_BATCH {
                    match rx.try_recv() {
                        Ok(Persist::Transition {
                            transition,
                            incident,
                            health,
                        }) => batch.push((transition, incident, health)),
                        Ok(other) => {
                            next = Some(other);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                store_transitions(&writer, &batch).await;
            }
            Persist::Save { states, at } => {
                if let Err(e) = writer.save_health(&states, at).await {
                    tracing::error!(routes = states.len(), error = %e, "cannot save route states");
                }
            }
            Persist::Baselines(saved, failed) => {
                let routes = saved.len();
                if let Err(e) = writer.save_baselines(saved).await {
                    failed.store(true, Ordering::Release);
                    tracing::error!(routes, error = %e, "cannot save baselines; the next save writes them whole");
                }
            }
            Persist::Heartbeat(at) => {
                if let Err(e) = writer.heartbeat(HEARTBEAT_JOB, at).await {
                    tracing::error!(error = %e, "cannot write the health heartbeat");
                }
            }
        }
    }
}

/// Transitions stored together at most.
const TRANSITION_BATCH: usize = 512;

type TransitionWrite = (Box<Transition>, Option<Box<Incident>>, Box<RouteHealth>);

async fn store_transitions(writer: &Writer, batch: &[TransitionWrite]) {
    let items: Vec<(&Transition, Option<&Incident>, &RouteHealth)> = batch
        .iter()
        .map(|(t, i, h)| (&**t, i.as_deref(), &**h))
        .collect();
    if items.len() > 1 && writer.record_transitions(&items).await.is_ok() {
        return;
    }
    for (t, i, h) in items {
        if let Err(e) = writer.record_transition(t, i, h).await {
            tracing::error!(route = %t.route, from = %t.from, to = %t.to, error = %e, "cannot store a transition");
        }
    }
}

impl HealthService {
    /// Sends the states changed since their last save to the persister, [`SAVE_CHUNK`] at a
    /// time: each chunk is encoded and committed on its own, so a save of every route never
    /// holds every route's encoded state at once (about 40 MB at 10,000 routes).
    pub(super) async fn save_changed(&mut self, persist: &mpsc::Sender<Persist>) {
        let at = self.clock.now();
        let mut changed = self.routes.iter_mut().filter(|r| r.unsaved);
        loop {
            let states: Vec<RouteHealth> = changed
                .by_ref()
                .take(SAVE_CHUNK)
                .map(|r| {
                    r.unsaved = false;
                    r.health.clone()
                })
                .collect();
            if states.is_empty() {
                break;
            }
            send(persist, Persist::Save { states, at }).await;
        }
    }

    /// Sends the baselines' parts changed since their last save, [`SAVE_CHUNK`] baselines a
    /// message: the routes' own, then the remote vantages'. Routes still warming are not
    /// saved: their baseline is partial, and the saved state they were loaded from stays (the
    /// remote vantages' are loaded before the start returns: always whole).
    pub(super) async fn save_baselines(&mut self, persist: &mpsc::Sender<Persist>) {
        let all = self.baselines_failed.swap(false, Ordering::AcqRel);
        let warming = self.warming.as_ref();
        let own = self
            .routes
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| warming.is_none_or(|w| w.is_warm(*i)))
            .map(|(_, r)| (OWN, &mut r.baseline));
        let failed = self.baselines_failed.clone();
        let mut changed = own
            .chain(self.board.baselines_mut())
            .filter(|(_, b)| all || b.unsaved());
        loop {
            // Encoded a chunk at a time: a first save of every route is tens of MB.
            let chunk: Vec<SavedBaseline> = changed
                .by_ref()
                .take(SAVE_CHUNK)
                .map(|(vantage, b)| {
                    let (shape, newest) = (b.shape(), b.newest());
                    let parts = b.take_parts(all);
                    SavedBaseline {
                        route: b.route().to_string(),
                        vantage: vantage.to_owned(),
                        shape,
                        newest,
                        head: parts.head,
                        buckets: parts.buckets,
                    }
                })
                .collect();
            if chunk.is_empty() {
                break;
            }
            send(persist, Persist::Baselines(chunk, failed.clone())).await;
        }
    }
}
