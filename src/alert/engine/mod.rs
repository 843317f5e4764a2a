//! The alert task: consumes health events, groups them, applies maintenance and silences,
//! writes the outbox (with the firing state, in one transaction), and delivers — on its own
//! sub-task, so a slow receiver never holds up the events. Once a minute it also evaluates
//! SLO burn rates, stale job heartbeats and reminders.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{broadcast, Notify};
use tokio_util::sync::CancellationToken;

use super::announced::Announced;
use super::group::{Draft, Grouper};
use super::maintenance::{Silence, Suppressor};
use super::outbox::Outbox;
use super::{
    accepts, burn, routing, AlertError, AlertMetrics, Message, Notifier, RenderCtx, Severity,
    Status, Subject,
};
use crate::clock::Clock;
use crate::config::Config;
use crate::health::HealthEvent;
use crate::heartbeat::Pulse;
use crate::reload::LiveConfig;
use crate::route::Route;
use crate::store::alerts::{AlertOp, FiringRow, NewEntry};
use crate::store::Store;

// The recoveries of a shared cause's routes, held back until its last route is back.
mod causes;
// Resolutions lost with a leader's memory, sent from what the store says.
mod lost;
// Burn rates, route faults and drift findings of one provider gathered into one message.
mod pages;
// Reminders of what still fires.
mod reminders;

/// How often due outbox rows are looked for when nothing wakes the sender sooner.
pub const DELIVERY_POLL: Duration = Duration::from_secs(1);
/// How often burn rates, heartbeats and reminders are evaluated.
pub const EVALUATE_EVERY: Duration = Duration::from_secs(60);
/// How often the loops beat their heartbeats (`alert_eval`, `alert_outbox`).
pub const BEAT_EVERY: Duration = crate::heartbeat::PULSE_EVERY;
/// Delivered and dropped rows, and ended silences, are kept this long.
pub const KEEP_DONE: chrono::Duration = chrono::Duration::days(7);
/// An incident closed in the store this long (or twice `group_wait`, if longer) while its
/// alert still fires here had its resolution lost: it is sent then.
pub const LOST_AFTER: chrono::Duration = chrono::Duration::minutes(5);
/// Incidents read per route when looking for one whose resolution was lost.
const LOST_SCAN: usize = 50;

/// Everything the alert task needs; shareable so tests (and `alert test`) can drive it.
pub struct AlertService {
    /// The config in effect; a reload replaces it ([`AlertService::apply`]).
    config: std::sync::RwLock<Arc<Config>>,
    pub store: Store,
    pub clock: Arc<dyn Clock>,
    pub outbox: Outbox,
    routes: Vec<Route>,
    /// Scheduled jobs whose heartbeats must stay fresh (`[heartbeat] stale_after`).
    jobs: crate::heartbeat::Jobs,
    /// The loops' own heartbeats.
    eval_pulse: Option<Pulse>,
    outbox_pulse: Option<Pulse>,
    /// Followed by [`run`]: `[alerting]`, `[[alert.*]]`, `[[maintenance]]`, `[heartbeat]`.
    live: Option<LiveConfig>,
    wake: Notify,
    /// The burn-rate windows as running sums; without it they are read from the rollups.
    tally: Option<Arc<super::tally::Tally>>,
}

impl AlertService {
    pub fn new(
        config: Arc<Config>,
        store: Store,
        clock: Arc<dyn Clock>,
        channels: Vec<Arc<dyn Notifier>>,
    ) -> Self {
        let ctx = RenderCtx::from_config(&config);
        let outbox = Outbox::new(
            store.clone(),
            channels,
            ctx,
            Arc::new(AlertMetrics::default()),
        );
        let started_at = clock.now();
        Self {
            routes: config.routes(),
            config: std::sync::RwLock::new(config),
            store,
            clock,
            outbox,
            jobs: crate::heartbeat::Jobs::new(Vec::new(), started_at),
            eval_pulse: None,
            outbox_pulse: None,
            live: None,
            wake: Notify::new(),
            tally: None,
        }
    }

    /// The config in effect.
    pub fn config(&self) -> Arc<Config> {
        self.config
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The jobs whose heartbeats alert when stale (a job that never beat counts from
    /// `jobs.started_at`).
    pub fn with_jobs(mut self, jobs: &crate::heartbeat::Jobs) -> Self {
        self.jobs = jobs.clone();
        self
    }

    /// Beats `alert_eval` and `alert_outbox` through `pulses`.
    pub fn with_pulses(mut self, pulses: &crate::heartbeat::Pulses) -> Self {
        self.eval_pulse = Some(pulses.pulse(crate::heartbeat::ALERT_EVAL));
        self.outbox_pulse = Some(pulses.pulse(crate::heartbeat::ALERT_OUTBOX));
        self
    }

    /// Reads the burn-rate windows from `tally` (kept by whoever records the outcomes) instead
    /// of the store: an evaluation then reads no rollup row.
    pub fn with_tally(mut self, tally: Arc<super::tally::Tally>) -> Self {
        self.tally = Some(tally);
        self
    }

    /// Follows config reloads while [`run`] runs.
    pub fn with_live(mut self, live: LiveConfig) -> Self {
        self.live = Some(live);
        self
    }

    /// A reloaded config: channels rebuilt (the reload checked they build), links, windows,
    /// grouping and `stale_after` follow. Routes are not reloaded (a restart applies them).
    pub fn apply(&self, config: Arc<Config>) -> Result<(), AlertError> {
        let channels = super::channels(&config)?;
        self.outbox
            .reconfigure(channels, RenderCtx::from_config(&config));
        *self.config.write().unwrap_or_else(|e| e.into_inner()) = config;
        Ok(())
    }

    pub fn with_outbox(mut self, f: impl FnOnce(Outbox) -> Outbox) -> Self {
        let ctx = RenderCtx::from_config(&self.config());
        let placeholder = Outbox::new(
            self.store.clone(),
            Vec::new(),
            ctx,
            Arc::new(AlertMetrics::default()),
        );
        let outbox = std::mem::replace(&mut self.outbox, placeholder);
        self.outbox = f(outbox);
        self
    }

    pub fn grouper(&self) -> Grouper {
        Grouper::new(self.config().alerting.group_wait, &self.routes)
    }

    pub fn metrics(&self) -> &Arc<AlertMetrics> {
        self.outbox.metrics()
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(crate::store::Reader) -> Result<T, crate::store::StoreError> + Send + 'static,
    ) -> Result<T, AlertError> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || f(store.reader()?))
            .await
            .map_err(|e| AlertError::Store(e.to_string()))?
            .map_err(AlertError::from)
    }

    /// Silences in the store.
    pub async fn silences(&self) -> Result<Vec<Silence>, AlertError> {
        self.blocking(|r| r.silences()).await
    }

    /// Applies maintenance, silences and the firing state to `drafts`, writes the outbox rows
    /// (one per accepting channel) and wakes the sender. Returns how many rows were new.
    pub async fn enqueue(&self, drafts: Vec<Draft>, now: DateTime<Utc>) -> Result<u64, AlertError> {
        if drafts.is_empty() {
            return Ok(0);
        }
        // A resolution reads what it resolves; a burn rate, the state alerts it may fold into;
        // routes of a shared cause, what their channels were told of it.
        let resolving = drafts.iter().any(|d| {
            d.message.status == Status::Resolved
                || matches!(d.message.subject, Subject::BurnRate(_))
                || d.message.items.iter().any(|i| i.cause.is_some())
        });
        let (silences, firing) = self
            .blocking(move |r| {
                let firing = if resolving {
                    r.alert_firing()?
                } else {
                    // Nothing resolves: the keys suffice (no message text is read).
                    r.alert_firing_keys()?
                        .into_iter()
                        .map(|key| FiringRow {
                            key,
                            message: Arc::from(""),
                            opened_at: DateTime::UNIX_EPOCH,
                        })
                        .collect()
                };
                Ok((r.silences()?, firing))
            })
            .await?;
        let mut firing_now = Announced::new(&firing);
        drop(firing);
        let config = self.config();
        let suppressor = Suppressor {
            windows: &config.maintenance,
            silences: &silences,
            now,
        };
        let mut entries = Vec::new();
        let mut fire = Vec::new();
        let mut resolve = Vec::new();
        let mut pages = pages::Pages::new(&config);
        let mut texts = super::texts::Texts::default();
        for d in drafts {
            let Draft {
                mut message,
                item_keys,
                key,
            } = d;
            if let Some(k) = key
                .clone()
                .filter(|_| pages::Pages::wants(&message, key.as_ref()))
            {
                if message.status == Status::Resolved {
                    pages.resolved(message, k, &mut firing_now, &mut resolve);
                } else if !pages.said(&message, &k, &mut firing_now) {
                    match suppressor.filter(message) {
                        Ok(m) => pages.fire(m, k),
                        Err(why) => {
                            tracing::info!(reason = ?why, "alert suppressed by maintenance or silence");
                            for ch in self.outbox.channels().iter() {
                                self.metrics().add(ch.name(), "suppressed");
                            }
                        }
                    }
                }
                continue;
            }
            let mut keys: HashMap<String, Option<String>> = message
                .items
                .iter()
                .map(|i| i.route.to_string())
                .zip(item_keys)
                .collect();
            // The texts of the firing messages this resolution's routes were announced by.
            let mut announced_by = Vec::new();
            if message.status == Status::Resolved {
                // Only what was announced is resolved (and a resolution is never silenced).
                message.items.retain(|i| {
                    keys.get(i.route.as_str())
                        .and_then(Option::as_ref)
                        .is_some_and(|k| firing_now.is_firing(k))
                });
                causes::hold(
                    &mut message,
                    &mut keys,
                    &mut firing_now,
                    &mut fire,
                    &mut resolve,
                    now,
                )?;
                let whole = key.as_ref().is_some_and(|k| firing_now.is_firing(k));
                if message.items.is_empty() && !whole {
                    continue;
                }
                for i in &message.items {
                    if let Some(Some(k)) = keys.remove(i.route.as_str()) {
                        announced_by.extend(firing_now.resolve(&k));
                        resolve.push(k);
                    }
                }
                if let Some(k) = key {
                    let opened_by = firing_now.resolve(&k);
                    // An alert with a state of its own (a route fault, a burn rate, a silent
                    // job) tags its firing and its resolved message differently: the incident
                    // tools close the one its firing message opened.
                    if message.items.is_empty() && message.resolves.is_none() {
                        // Many routes' resolutions may name one gathered message: parsed once.
                        if let Some(opened) = opened_by.and_then(|t| texts.get(&t)) {
                            message.resolves =
                                Some(vec![super::oncall::incident_key(&opened.message)]);
                        }
                    }
                    resolve.push(k);
                }
            } else {
                // A route fault is announced once until the route answers normally, even when
                // the detection restarted and saw it anew; a withdrawn model once until it is
                // listed again, however many answers lack it.
                if matches!(
                    message.subject,
                    Subject::RouteFault { .. } | Subject::ModelWithdrawn { .. }
                ) && key.as_ref().is_some_and(|k| firing_now.is_firing(k))
                {
                    continue;
                }
                message = match suppressor.filter(message) {
                    Ok(m) => m,
                    Err(why) => {
                        tracing::info!(reason = ?why, "alert suppressed by maintenance or silence");
                        for ch in self.outbox.channels().iter() {
                            self.metrics().add(ch.name(), "suppressed");
                        }
                        continue;
                    }
                };
                // One text for the whole message, however many routes it groups.
                let json: Arc<str> = Arc::from(to_json(&message)?);
                for i in &message.items {
                    if let Some(Some(k)) = keys.remove(i.route.as_str()) {
                        firing_now.fire(&k, &json);
                        fire.push(FiringRow {
                            key: k,
                            message: json.clone(),
                            opened_at: i.opened_at.unwrap_or(i.at),
                        });
                    }
                }
                if let Some(k) = key {
                    firing_now.fire(&k, &json);
                    fire.push(FiringRow {
                        key: k,
                        message: json.clone(),
                        opened_at: message.at,
                    });
                }
            }
            entries.extend(self.entries(&message, &announced_by, &mut firing_now, now)?);
        }
        pages.finish(self, &mut firing_now, &mut fire, &mut entries, now)?;
        let n = self
            .store
            .writer()
            .alert(AlertOp::Enqueue {
                entries,
                firing: fire,
                resolved: resolve,
            })
            .await?;
        if n > 0 {
            self.wake.notify_one();
        }
        Ok(n)
    }

    /// One outbox row per channel that accepts `m`, under `<key>#<channel>`: each channel gets
    /// `m` as its `routes` see it (regrouped over its own routes, with its own key). A
    /// resolution of routes announced by the messages `announced_by` tells an incident tool
    /// which of its triggers to resolve, and skips it when that is none.
    fn entries(
        &self,
        m: &Message,
        announced_by: &[Arc<str>],
        firing: &mut Announced,
        now: DateTime<Utc>,
    ) -> Result<Vec<NewEntry>, AlertError> {
        let mut out = Vec::new();
        for c in self.outbox.channels().iter() {
            let Some(own) = routing::for_channel(m, &c.options().routes) else {
                continue;
            };
            let Some(mut own) = firing.unheard(c.name(), &c.options().routes, own) else {
                continue;
            };
            if !accepts(c.options(), &own) {
                continue;
            }
            if c.resolves_by_key() && pages::closes_by_announced(m, announced_by) {
                let keys = firing.closed_keys(announced_by, &c.options().routes);
                if keys.is_empty() {
                    continue;
                }
                own.to_mut().resolves = Some(keys);
            }
            let json = to_json(&own)?;
            let key = format!("{}#{}", own.key, c.name());
            // Rows are sent in id order: each message before its mention part.
            let mention = c.mention_part(&own);
            out.push(NewEntry {
                dedup_key: key.clone(),
                channel: c.name().to_owned(),
                message: json.clone(),
                created_at: now,
            });
            if mention {
                out.push(NewEntry {
                    dedup_key: format!("{key}{}", super::outbox::MENTION_PART),
                    channel: c.name().to_owned(),
                    message: json,
                    created_at: now,
                });
            }
        }
        Ok(out)
    }

    /// Burn rates, stale heartbeats and reminders at `now`.
    pub async fn evaluate(&self, now: DateTime<Utc>) -> Result<u64, AlertError> {
        let routes: Vec<(crate::route::RouteId, f64)> =
            self.routes.iter().map(|r| (r.id.clone(), r.slo)).collect();
        let (windows, beats, firing) = match self.tally.clone() {
            Some(tally) => {
                let windows = routes
                    .into_iter()
                    .map(|(id, slo)| {
                        let w = tally.windows(&id, now).unwrap_or_default();
                        (id, slo, w)
                    })
                    .collect::<Vec<_>>();
                let (beats, firing) = self
                    .blocking(|r| Ok((r.heartbeats()?, r.alert_firing()?)))
                    .await?;
                (windows, beats, firing)
            }
            None => {
                self.blocking(move |r| {
                    let mut w = Vec::new();
                    for (id, slo) in routes {
                        w.push((id.clone(), slo, burn::read_windows(&r, &id, now)?));
                    }
                    Ok((w, r.heartbeats()?, r.alert_firing()?))
                })
                .await?
            }
        };
        let firing_keys: HashMap<&str, &FiringRow> =
            firing.iter().map(|f| (f.key.as_str(), f)).collect();
        let config = self.config();
        let min_failures = u64::from(config.detection.min_failures);
        let mut drafts = Vec::new();
        let mut fresh = Vec::new();
        let mut texts = super::texts::Texts::default();
        for (route, slo, w) in &windows {
            let key = format!("burn:{route}");
            let verdict = burn::evaluate(route, *slo, w, min_failures);
            let row = firing_keys.get(key.as_str());
            // Its own page, a gathered page naming it, or folded into its state alert (none).
            let was = row
                .and_then(|f| texts.get(&f.message))
                .and_then(|p| super::group::batch::burn_of(&p.message, route));
            match (verdict, row, was) {
                (Some(b), None, _) => fresh.push((b, key)),
                (Some(b), Some(_), Some(was)) if !was.page && b.page => {
                    drafts.push(burn_draft(b, key, now, Status::Firing))
                }
                (None, Some(_), Some(was)) => {
                    drafts.push(burn_draft(was, key, now, Status::Resolved))
                }
                (None, Some(_), None) => {
                    // Folded: a resolution with nothing to say (its draft carries no text).
                    drafts.push(folded_resolution(key, route, now));
                }
                _ => {}
            }
        }
        drafts.extend(self.new_burn_pages(fresh, &firing_keys, now).await?);
        drafts.extend(self.lost_resolutions(&firing, &mut texts, now).await);
        drafts.extend(causes::overdue(&firing, &mut texts, now));
        let stale = self.jobs.stale(&beats, now, config.heartbeat.stale_after);
        for job in &self.jobs.names {
            let key = format!("heartbeat:{job}");
            let silent = stale.iter().find(|s| s.job == *job);
            let firing = firing_keys.contains_key(key.as_str());
            if silent.is_some() == firing {
                continue;
            }
            let (status, silent_s) = match silent {
                Some(s) => (Status::Firing, s.silent.as_secs()),
                None => (Status::Resolved, 0),
            };
            drafts.push(Draft {
                message: Message {
                    key: format!(
                        "{key}:{}@{}",
                        if silent.is_some() {
                            "stale"
                        } else {
                            "resolved"
                        },
                        now.timestamp_millis()
                    ),
                    severity: Severity::Critical,
                    status,
                    subject: Subject::Heartbeat {
                        job: (*job).to_owned(),
                        silent_s,
                    },
                    at: now,
                    items: Vec::new(),
                    related: Vec::new(),
                    note: None,
                    resolves: None,
                },
                item_keys: Vec::new(),
                key: Some(key),
            });
        }
        let mut n = self.enqueue(drafts, now).await?;
        n += self.reminders(&firing, now).await?;
        if let Err(e) = self
            .store
            .writer()
            .alert(AlertOp::Prune {
                before: now - KEEP_DONE,
            })
            .await
        {
            tracing::warn!(error = %e, "cannot prune old alert rows");
        }
        let bound = AlertOp::Bound {
            max_rows: super::outbox::MAX_ROWS,
        };
        match self.store.writer().alert(bound).await {
            Ok(0) => {}
            Ok(evicted) => {
                tracing::warn!(
                    evicted,
                    "alert outbox over its row bound: oldest rows deleted"
                );
                self.metrics().evicted(evicted);
            }
            Err(e) => tracing::warn!(error = %e, "cannot bound the alert outbox"),
        }
        Ok(n)
    }

    /// Sends what is due now.
    pub async fn deliver(&self) -> Result<super::outbox::Round, AlertError> {
        self.outbox.deliver_due(self.clock.now()).await
    }
}

fn burn_draft(b: burn::BurnAlert, key: String, now: DateTime<Utc>, status: Status) -> Draft {
    let kind = if b.page { "page" } else { "ticket" };
    let severity = if b.page {
        Severity::Critical
    } else {
        Severity::Warning
    };
    let tag = if status == Status::Resolved {
        "resolved"
    } else {
        kind
    };
    Draft {
        message: Message {
            key: format!("{key}:{tag}@{}", now.timestamp_millis()),
            severity,
            status,
            at: now,
            items: Vec::new(),
            related: vec![b.route.clone()],
            subject: Subject::BurnRate(b),
            note: None,
            resolves: None,
        },
        item_keys: Vec::new(),
        key: Some(key),
    }
}

/// The resolution of a burn rate folded into its route's state alert: it only closes the
/// firing state (nothing was sent for it, so nothing is).
fn folded_resolution(key: String, route: &crate::route::RouteId, now: DateTime<Utc>) -> Draft {
    let b = burn::BurnAlert {
        route: route.clone(),
        page: true,
        slo: 0.0,
        factor: 0.0,
        burn_long: 0.0,
        burn_short: 0.0,
        long_window_s: 0,
        short_window_s: 0,
        failures: 0,
        total: 0,
    };
    burn_draft(b, key, now, Status::Resolved)
}

fn to_json(m: &Message) -> Result<String, AlertError> {
    serde_json::to_string(m)
        .map_err(|e| AlertError::Store(format!("cannot serialise a message: {e}")))
}

/// Runs the alert engine until `shutdown`: events → grouped drafts → outbox; a sub-task
/// delivers. On shutdown what is gathered but not yet grouped is written to the outbox, so
/// the next start sends it. A lagging event receiver logs how much it missed and goes on.
pub async fn run(
    service: Arc<AlertService>,
    mut events: broadcast::Receiver<HealthEvent>,
    shutdown: CancellationToken,
) {
    let sender = tokio::spawn(deliver_loop(service.clone(), shutdown.clone()));
    let mut grouper = service.grouper();
    let mut immediate = service.config().alerting.group_wait.is_zero();
    let mut evaluate = tokio::time::interval(EVALUATE_EVERY);
    evaluate.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut beat = tokio::time::interval(BEAT_EVERY);
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut live = service.live.as_ref().map(LiveConfig::receiver);
    let mut open = true;
    let mut unsent = Unsent::default();
    loop {
        let reloaded = async {
            match live.as_mut() {
                Some(rx) => rx.changed().await.map(|()| rx.borrow_and_update().clone()),
                None => std::future::pending().await,
            }
        };
        let wait = grouper
            .deadline()
            .map(|d| (d - service.clock.now()).to_std().unwrap_or(Duration::ZERO));
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            ev = events.recv(), if open => match ev {
                Ok(ev) => {
                    let now = service.clock.now();
                    grouper.push(ev, now);
                    // Whatever else already arrived belongs to the same moment.
                    while let Ok(ev) = events.try_recv() {
                        grouper.push(ev, now);
                    }
                    if immediate {
                        flush(&service, &mut grouper, &mut unsent).await;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(missed = n, "alert engine fell behind the health events; some transitions were not alerted");
                }
                Err(broadcast::error::RecvError::Closed) => open = false,
            },
            _ = tokio::time::sleep(wait.unwrap_or(Duration::ZERO)), if wait.is_some() => {
                flush(&service, &mut grouper, &mut unsent).await;
            }
            _ = tokio::time::sleep(RETRY_UNSENT), if !unsent.0.is_empty() => {
                flush(&service, &mut grouper, &mut unsent).await;
            }
            _ = evaluate.tick() => {
                if let Err(e) = service.evaluate(service.clock.now()).await {
                    tracing::error!(error = %e, "alert evaluation (burn rates, heartbeats, reminders) failed");
                }
            }
            // The loop itself is alive: neither stuck in an evaluation nor in a flush.
            _ = beat.tick() => {
                if let Some(p) = &service.eval_pulse {
                    p.beat();
                }
            }
            config = reloaded => match config {
                Ok(config) => {
                    let group_wait = config.alerting.group_wait;
                    match service.apply(config) {
                        Ok(()) => {
                            grouper.set_group_wait(group_wait);
                            immediate = group_wait.is_zero();
                            tracing::debug!("alerting follows the reloaded config");
                        }
                        Err(e) => tracing::error!(error = %e, "alert channels from the reloaded config are unusable; keeping the previous ones"),
                    }
                }
                Err(_) => live = None,
            },
        }
    }
    if !grouper.is_empty() || !unsent.0.is_empty() {
        flush(&service, &mut grouper, &mut unsent).await;
    }
    let _ = sender.await;
}

/// Grouped messages the outbox could not take yet (the database away), oldest first: written
/// with the next flush, so a transition that happens during an outage is announced late, not
/// never.
#[derive(Default)]
struct Unsent(Vec<Draft>);

/// Unsent messages kept at most; past it the oldest are dropped (and said so).
const MAX_UNSENT: usize = 10_000;
/// How often unsent messages are tried again while nothing else flushes.
const RETRY_UNSENT: Duration = Duration::from_secs(2);

async fn flush(service: &AlertService, grouper: &mut Grouper, unsent: &mut Unsent) {
    let now = service.clock.now();
    let mut drafts = std::mem::take(&mut unsent.0);
    drafts.extend(grouper.flush(now));
    if drafts.is_empty() {
        return;
    }
    let kept = drafts.clone();
    if let Err(e) = service.enqueue(drafts, now).await {
        let mut kept = kept;
        if kept.len() > MAX_UNSENT {
            let dropped = kept.len() - MAX_UNSENT;
            kept.drain(..dropped);
            tracing::error!(
                dropped,
                "alert messages dropped: too many waiting for the outbox"
            );
        }
        tracing::error!(error = %e, waiting = kept.len(), "cannot write alerts to the outbox yet; trying again");
        unsent.0 = kept;
    }
}

async fn deliver_loop(service: Arc<AlertService>, shutdown: CancellationToken) {
    loop {
        // A round ends within the channels' timeouts; one stuck longer stops the beats.
        if let Some(p) = &service.outbox_pulse {
            p.beat();
        }
        match service.deliver().await {
            Ok(r) if r != super::outbox::Round::default() => {
                tracing::debug!(?r, "alert delivery round");
            }
            Ok(_) => {}
            Err(e) => tracing::error!(error = %e, "alert delivery round failed"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = service.wake.notified() => {}
            _ = tokio::time::sleep(DELIVERY_POLL) => {}
        }
    }
}
