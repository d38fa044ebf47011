//! The in-process twin of the queue: what a single node runs with
//! `stream.type = "local"`.
//!
//! Same contract as JetStream: interest retention (a publish no
//! subscription covers is dropped), one cursor per subscription, redelivery
//! of an unsettled message after the ack window, message-id dedupe within
//! a two-minute window, and dead letters kept for inspection. Time is
//! tokio's clock, so tests can pause and advance it. Nothing here survives
//! the process — which is what a single node with no stream means.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;
use tokio::time::Instant;

use super::attach::{Fetched, Settle, Source};
use super::{
    Attachment, DeadLetter, DeadLetterReason, Delivery, EventSink, Handler, Queue, QueueError,
    SubscriptionInfo, SubscriptionSpec, subject_matches,
};

/// How long a message id is remembered for dedupe.
pub const DEDUPE_WINDOW: Duration = Duration::from_secs(120);
/// Dead letters kept (oldest dropped first).
const DEAD_LETTERS_KEPT: usize = 10_000;

#[derive(Clone)]
struct Msg {
    seq: u64,
    subject: String,
    payload: Bytes,
    msg_id: Option<String>,
    delivered: u64,
}

struct Sub {
    spec: SubscriptionSpec,
    ready: VecDeque<Msg>,
    /// token → (message, redelivery deadline)
    inflight: BTreeMap<u64, (Msg, Instant)>,
    /// Bumped on every change a waiting fetch cares about.
    changed: Arc<watch::Sender<u64>>,
    /// Bumped when the subscription is deleted and created again, so a
    /// settle from the old one cannot touch the new one.
    generation: u64,
}

#[derive(Default)]
struct State {
    subs: BTreeMap<String, Sub>,
    seq: u64,
    token: u64,
    generation: u64,
    seen_ids: HashMap<String, Instant>,
    dead: VecDeque<DeadLetter>,
    /// The last dead letter's number.
    dead_seq: u64,
}

/// The in-process queue.
#[derive(Clone)]
pub struct TwinQueue {
    state: Arc<Mutex<State>>,
    events: EventSink,
}

impl TwinQueue {
    pub fn new(events: EventSink) -> TwinQueue {
        TwinQueue {
            state: Arc::new(Mutex::new(State::default())),
            events,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Move every overdue in-flight message back to the front of `ready`.
fn expire(sub: &mut Sub, now: Instant) {
    let overdue: Vec<u64> = sub
        .inflight
        .iter()
        .filter(|(_, (_, deadline))| *deadline <= now)
        .map(|(t, _)| *t)
        .collect();
    for t in overdue.into_iter().rev() {
        if let Some((m, _)) = sub.inflight.remove(&t) {
            sub.ready.push_front(m);
        }
    }
}

#[async_trait::async_trait]
impl Queue for TwinQueue {
    async fn ensure_subscription(&self, spec: &SubscriptionSpec) -> Result<(), QueueError> {
        let mut st = self.lock();
        if let Some(existing) = st.subs.get_mut(&spec.name) {
            if existing.spec.only_ack_wait_differs(spec) {
                tracing::warn!(subscription = %spec.name, from_s = existing.spec.ack_wait.as_secs(), to_s = spec.ack_wait.as_secs(), "a mailbox's ack window changes to this node's stream.ack_wait_seconds");
                existing.spec.ack_wait = spec.ack_wait;
                return Ok(());
            }
            if existing.spec != *spec {
                return Err(QueueError::SettingsMismatch {
                    name: spec.name.clone(),
                    existing: existing.spec.describe(),
                    wanted: spec.describe(),
                });
            }
            return Ok(());
        }
        st.generation += 1;
        let generation = st.generation;
        st.subs.insert(
            spec.name.clone(),
            Sub {
                spec: spec.clone(),
                ready: VecDeque::new(),
                inflight: BTreeMap::new(),
                changed: Arc::new(watch::Sender::new(0)),
                generation,
            },
        );
        Ok(())
    }

    async fn delete_subscription(&self, name: &str) -> Result<bool, QueueError> {
        let removed = self.lock().subs.remove(name);
        if let Some(sub) = &removed {
            sub.changed.send_modify(|v| *v += 1);
        }
        Ok(removed.is_some())
    }

    async fn list_subscriptions(&self) -> Result<Vec<SubscriptionInfo>, QueueError> {
        Ok(self
            .lock()
            .subs
            .values()
            .map(|s| SubscriptionInfo {
                name: s.spec.name.clone(),
                subject: s.spec.subject.clone(),
            })
            .collect())
    }

    async fn publish(
        &self,
        subject: &str,
        msg_id: Option<&str>,
        payload: Bytes,
    ) -> Result<bool, QueueError> {
        let now = Instant::now();
        let mut st = self.lock();
        st.seen_ids
            .retain(|_, at| now.duration_since(*at) < DEDUPE_WINDOW);
        if let Some(id) = msg_id {
            if st.seen_ids.contains_key(id) {
                return Ok(false);
            }
            st.seen_ids.insert(id.to_string(), now);
        }
        st.seq += 1;
        let msg = Msg {
            seq: st.seq,
            subject: subject.to_string(),
            payload,
            msg_id: msg_id.map(str::to_string),
            delivered: 0,
        };
        // Interest retention: every covering subscription keeps its own
        // copy; with none, the message is dropped here.
        for sub in st.subs.values_mut() {
            if subject_matches(&sub.spec.subject, subject) {
                sub.ready.push_back(msg.clone());
                sub.changed.send_modify(|v| *v += 1);
            }
        }
        Ok(true)
    }

    async fn attach(
        &self,
        name: &str,
        holds: &[&str],
        handler: Arc<dyn Handler>,
    ) -> Result<Attachment, QueueError> {
        let (max, generation) = {
            let st = self.lock();
            let sub = st
                .subs
                .get(name)
                .ok_or_else(|| QueueError::NoSuchSubscription(name.to_string()))?;
            (sub.spec.max_deliveries, sub.generation)
        };
        let source = Arc::new(MemorySource {
            queue: self.clone(),
            name: name.to_string(),
            generation,
        });
        Ok(Attachment::start(
            name.to_string(),
            max,
            holds,
            source,
            handler,
            self.events.clone(),
        ))
    }

    async fn pending(&self, name: &str) -> Result<u64, QueueError> {
        let st = self.lock();
        let sub = st
            .subs
            .get(name)
            .ok_or_else(|| QueueError::NoSuchSubscription(name.to_string()))?;
        Ok((sub.ready.len() + sub.inflight.len()) as u64)
    }

    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, QueueError> {
        Ok(self.lock().dead.iter().rev().take(limit).cloned().collect())
    }

    async fn dead_letter_count(&self) -> Result<u64, QueueError> {
        Ok(self.lock().dead.len() as u64)
    }

    async fn find_dead_letter(&self, id: u64) -> Result<Option<DeadLetter>, QueueError> {
        Ok(self.lock().dead.iter().find(|d| d.id == id).cloned())
    }

    async fn discard_dead_letter(&self, id: u64) -> Result<bool, QueueError> {
        let mut st = self.lock();
        let before = st.dead.len();
        st.dead.retain(|d| d.id != id);
        Ok(st.dead.len() != before)
    }
}

/// How long a twin fetch waits before its loop looks again: a minute.
const TWIN_FETCH_WAIT: Duration = Duration::from_secs(60);

struct MemorySource {
    queue: TwinQueue,
    name: String,
    generation: u64,
}

#[async_trait::async_trait]
impl Source for MemorySource {
    /// A fetch here wakes on every change of its subscription (a
    /// message, a hand-back, a delivery's window or delay running out):
    /// its wait only bounds how long a quiet loop goes without looking
    /// again, and nothing strands on the twin.
    fn fetch_wait(&self) -> Duration {
        TWIN_FETCH_WAIT
    }

    /// Nothing strands here: the loop's looks (which find nothing) need
    /// not cut its fetches shorter than their own wait.
    fn stranded_every(&self) -> Duration {
        TWIN_FETCH_WAIT
    }

    async fn next(&self, wait: Duration) -> Result<Option<Fetched>, QueueError> {
        let give_up = Instant::now() + wait;
        loop {
            let (mut changed, wake_at) = {
                let mut st = self.queue.lock();
                st.token += 1;
                let token = st.token;
                let Some(sub) = st
                    .subs
                    .get_mut(&self.name)
                    .filter(|s| s.generation == self.generation)
                else {
                    return Err(QueueError::NoSuchSubscription(self.name.clone()));
                };
                let now = Instant::now();
                expire(sub, now);
                if let Some(mut m) = sub.ready.pop_front() {
                    m.delivered += 1;
                    sub.inflight
                        .insert(token, (m.clone(), now + sub.spec.ack_wait));
                    let delivery = Delivery {
                        subscription: self.name.clone(),
                        subject: m.subject.clone(),
                        payload: m.payload.clone(),
                        delivered: m.delivered,
                        msg_id: m.msg_id.clone(),
                        seq: m.seq,
                    };
                    let settle = Box::new(MemorySettle {
                        queue: self.queue.clone(),
                        name: self.name.clone(),
                        generation: self.generation,
                        token,
                    });
                    return Ok(Some(Fetched { delivery, settle }));
                }
                let next_deadline = sub.inflight.values().map(|(_, d)| *d).min();
                let wake_at = next_deadline.map_or(give_up, |d| d.min(give_up));
                // Subscribed under the lock: no change after this look is missed.
                let mut rx = sub.changed.subscribe();
                rx.borrow_and_update();
                (rx, wake_at)
            };
            if Instant::now() >= give_up {
                return Ok(None);
            }
            tokio::select! {
                _ = changed.changed() => {}
                _ = tokio::time::sleep_until(wake_at) => {}
            }
            if Instant::now() >= give_up {
                // One last look before giving up.
                let st = self.queue.lock();
                let has = st.subs.get(&self.name).is_some_and(|s| !s.ready.is_empty());
                if !has {
                    return Ok(None);
                }
            }
        }
    }
}

struct MemorySettle {
    queue: TwinQueue,
    name: String,
    generation: u64,
    token: u64,
}

impl MemorySettle {
    fn take(&self, st: &mut State) -> Option<Msg> {
        let sub = st
            .subs
            .get_mut(&self.name)
            .filter(|s| s.generation == self.generation)?;
        sub.inflight.remove(&self.token).map(|(m, _)| m)
    }
}

#[async_trait::async_trait]
impl Settle for MemorySettle {
    async fn progress(&self) -> Result<(), QueueError> {
        let mut st = self.queue.lock();
        if let Some(sub) = st
            .subs
            .get_mut(&self.name)
            .filter(|s| s.generation == self.generation)
        {
            let window = sub.spec.ack_wait;
            if let Some((_, deadline)) = sub.inflight.get_mut(&self.token) {
                *deadline = Instant::now() + window;
            }
        }
        Ok(())
    }

    async fn ack(self: Box<Self>) -> Result<(), QueueError> {
        let mut st = self.queue.lock();
        self.take(&mut st);
        Ok(())
    }

    async fn nak(self: Box<Self>) -> Result<(), QueueError> {
        let mut st = self.queue.lock();
        if let Some(m) = self.take(&mut st)
            && let Some(sub) = st.subs.get_mut(&self.name)
        {
            sub.ready.push_front(m);
            sub.changed.send_modify(|v| *v += 1);
        }
        Ok(())
    }

    async fn nak_after(self: Box<Self>, delay: Duration) -> Result<(), QueueError> {
        let mut st = self.queue.lock();
        // It stays in flight until the delay has passed; then it comes
        // back like any overdue delivery.
        if let Some(sub) = st
            .subs
            .get_mut(&self.name)
            .filter(|s| s.generation == self.generation)
            && let Some((_, deadline)) = sub.inflight.get_mut(&self.token)
        {
            *deadline = Instant::now() + delay;
            sub.changed.send_modify(|v| *v += 1);
        }
        Ok(())
    }

    async fn dead_letter(self: Box<Self>, reason: &DeadLetterReason) -> Result<(), QueueError> {
        let mut st = self.queue.lock();
        if let Some(m) = self.take(&mut st) {
            st.dead_seq += 1;
            let id = st.dead_seq;
            st.dead.push_back(DeadLetter {
                id,
                subscription: self.name.clone(),
                subject: m.subject,
                seq: m.seq,
                delivered: m.delivered,
                msg_id: m.msg_id,
                reason: reason.to_string(),
                payload: m.payload,
                at: crate::clock::now_rfc3339(),
            });
            while st.dead.len() > DEAD_LETTERS_KEPT {
                st.dead.pop_front();
            }
        }
        Ok(())
    }
}
