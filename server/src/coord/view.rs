//! The live view of the leases bucket: a watch that takes in every write
//! (current values first, then changes), so the protocol gate costs the
//! same with ten leases held as with ten thousand.
//!
//! It owns one background task, started on demand and stopped once the view
//! has gone unused for `idle` (a minute as shipped), so a node that is not
//! claiming does not take in the fleet's heartbeats. An answer is given only
//! after the view has caught up with the bucket's last write as read from
//! the leader. Liveness is judged from `expires_at` on the store's clock:
//! server 2.9 sends no event when a key ages out.
//!
//! It must never answer from a view that is not level, never wait on the
//! stream's `last_seq` (after an expiry that points at a message that no
//! longer exists), and never outlive the owner's cancellation token.
//!
//! Nor may it sit on a watch that does not keep up: a reader that has
//! waited [`STALLED`] (within one opening) for a write that still exists
//! has the watch opened again. After NATS server restarts a watch went
//! silent, or delivered on but stayed tens of revisions behind the
//! bucket, for minutes (soak seed 12032 on nats-server 2.9.10: every gated
//! claim of two nodes timed out while their other calls were answered, and
//! the claims' reads kept the view from idling out).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::watch;

use super::kv::{Backend, BucketId, RawEvent};
use super::lease::{Lease, LeaseRecord, ResourceKind, StoreTime};
use super::{Revision, StoreError};
use crate::metrics::{self as m, Update};
use crate::tasks::Tasks;

/// Pure: what one read of the view moves: how many revisions it was
/// behind the bucket's last write, and how long it waited to be level.
pub fn lag_updates(behind: Revision, waited_seconds: f64) -> Vec<Update> {
    vec![
        Update::Set {
            name: m::LEASE_VIEW_LAG,
            value: behind as f64,
        },
        Update::observe(m::LEASE_VIEW_CATCH_UP, waited_seconds),
    ]
}

/// The view stops this long after it was last used (spec: a minute).
pub const DEFAULT_IDLE: Duration = Duration::from_secs(60);
/// How often a waiting reader re-checks that the write it waits for still exists.
const RECHECK: Duration = Duration::from_millis(100);
/// How long one attempt to open the watch may take.
const WATCH_OPEN: Duration = Duration::from_millis(500);
/// How long a failed watch waits before it is opened again.
const REOPEN: Duration = Duration::from_millis(200);
/// A read that has waited this long (within one opening of the watch) for
/// a write that exists has a watch that does not keep up: it is opened
/// again. A level watch applies a write within milliseconds; below the
/// store's bound on a call, so a claim that waits meets a reopened view.
pub const STALLED: Duration = Duration::from_secs(1);

/// The leases the view holds, indexed so the protocol floor costs what the
/// lower-protocol leases cost, not what the fleet's leases do.
#[derive(Default)]
pub struct ViewIndex {
    leases: BTreeMap<String, Lease>,
    /// Presence and seat leases (the kinds the gate counts) by protocol.
    by_protocol: BTreeMap<u32, BTreeSet<String>>,
}

impl ViewIndex {
    fn insert(&mut self, lease: Lease) {
        self.remove(&lease.resource.clone());
        if lease
            .kind()
            .is_some_and(ResourceKind::counts_for_protocol_gate)
        {
            self.by_protocol
                .entry(lease.protocol)
                .or_default()
                .insert(lease.resource.clone());
        }
        self.leases.insert(lease.resource.clone(), lease);
    }

    fn remove(&mut self, key: &str) {
        if let Some(old) = self.leases.remove(key)
            && let Some(set) = self.by_protocol.get_mut(&old.protocol)
        {
            set.remove(key);
            if set.is_empty() {
                self.by_protocol.remove(&old.protocol);
            }
        }
    }

    fn clear(&mut self) {
        self.leases.clear();
        self.by_protocol.clear();
    }

    /// Every lease (live or not) whose key starts with `prefix`.
    pub fn with_prefix<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = &'a Lease> + 'a {
        self.leases
            .range(prefix.to_string()..)
            .take_while(move |(k, _)| k.starts_with(prefix))
            .map(|(_, l)| l)
    }

    /// The same answer as [`super::lease::protocol_floor`] over every
    /// lease, looking only at the leases below `mine`.
    pub fn protocol_floor(&self, now: StoreTime, mine: u32) -> Option<u32> {
        self.by_protocol
            .range(..mine)
            .find(|(_, keys)| {
                keys.iter()
                    .any(|k| self.leases.get(k).is_some_and(|l| l.is_live(now)))
            })
            .map(|(p, _)| *p)
    }
}

#[derive(Default)]
struct ViewState {
    running: bool,
    index: ViewIndex,
    last_used: Option<tokio::time::Instant>,
    /// Counts the watch's openings (a start, a reopening).
    opened: u64,
    /// The opening whose first delivery was found complete (see
    /// [`LeaseView::read`]); until then every read checks it.
    settled: u64,
    /// When this opening last applied a write (or was opened).
    advanced_at: Option<tokio::time::Instant>,
    /// When this opening's watch was opened (`None` until it is).
    opened_at: Option<tokio::time::Instant>,
    /// The opening a reader found stalled (see [`STALLED`]).
    stalled: Option<u64>,
}

/// The view, shared by every clone of its store.
pub struct LeaseView {
    state: Mutex<ViewState>,
    /// The highest revision applied; reset to 0 when the watch is reopened.
    applied: watch::Sender<Revision>,
    idle: Duration,
    /// Wakes the task when a reader found the watch stalled.
    stall: tokio::sync::Notify,
}

impl LeaseView {
    pub fn new(idle: Duration) -> Arc<LeaseView> {
        let (applied, _) = watch::channel(0);
        Arc::new(LeaseView {
            state: Mutex::new(ViewState::default()),
            applied,
            idle,
            stall: tokio::sync::Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, ViewState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn running(&self) -> bool {
        self.lock().running
    }

    /// Mark a use, and start the task if it is not running.
    fn touch<B: Backend>(self: &Arc<Self>, backend: &Arc<B>, tasks: &Tasks) {
        let mut st = self.lock();
        st.last_used = Some(tokio::time::Instant::now());
        if st.running {
            return;
        }
        st.running = true;
        st.opened += 1;
        st.index.clear();
        st.advanced_at = None;
        st.opened_at = None;
        self.applied.send_replace(0);
        drop(st);
        let view = Arc::clone(self);
        let backend = Arc::clone(backend);
        tasks.spawn("coord_lease_view", async move { view.run(backend).await });
    }

    /// A read waiting since `began` for a write that exists: once it has
    /// waited [`STALLED`] within the current opening, the watch is asked to
    /// open again (once an opening).
    fn judge_stall(&self, began: tokio::time::Instant) {
        let mut st = self.lock();
        let stalled = st
            .opened_at
            .is_some_and(|o| o.max(began).elapsed() >= STALLED);
        if stalled && st.stalled != Some(st.opened) {
            st.stalled = Some(st.opened);
            drop(st);
            self.stall.notify_one();
        }
    }

    fn idle_expired(&self) -> bool {
        let st = self.lock();
        st.last_used.is_none_or(|t| t.elapsed() >= self.idle)
    }

    fn stop(&self) {
        let mut st = self.lock();
        st.running = false;
        st.index.clear();
    }

    async fn run<B: Backend>(self: Arc<Self>, backend: Arc<B>) {
        let tick = (self.idle / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        let mut idle_check = tokio::time::interval(tick);
        loop {
            // An attempt that goes unanswered (its consumer placed on a
            // cluster member that is gone) is abandoned and tried again.
            let opened =
                tokio::time::timeout(WATCH_OPEN, backend.watch(BucketId::Leases, "")).await;
            let mut stream = match opened.unwrap_or_else(|_| Err(StoreError::Timeout(WATCH_OPEN))) {
                Ok(s) => {
                    let mut st = self.lock();
                    let now = tokio::time::Instant::now();
                    st.advanced_at = Some(now);
                    st.opened_at = Some(now);
                    st.stalled = None;
                    s
                }
                Err(e) => {
                    tracing::debug!(error = %e, "lease view: watch could not be opened");
                    tokio::time::sleep(REOPEN).await;
                    if self.idle_expired() {
                        self.stop();
                        return;
                    }
                    continue;
                }
            };
            loop {
                tokio::select! {
                    ev = stream.next() => match ev {
                        Some(Ok(ev)) => self.apply(ev, backend.lease_ttl()),
                        Some(Err(e)) => {
                            tracing::debug!(error = %e, "lease view: watch failed; reopening");
                            break;
                        }
                        None => break,
                    },
                    _ = idle_check.tick() => {
                        if self.idle_expired() {
                            tracing::debug!("lease view stopped: unused");
                            self.stop();
                            return;
                        }
                    }
                    _ = self.stall.notified() => {
                        let st = self.lock();
                        if st.stalled == Some(st.opened) {
                            tracing::warn!(
                                stalled_s = STALLED.as_secs_f64(),
                                "the lease view stayed behind a write that exists; opening its watch again"
                            );
                            break;
                        }
                    }
                }
            }
            // Reopened from scratch: current values again, nothing stale kept.
            {
                let mut st = self.lock();
                st.opened += 1;
                st.index.clear();
                // Judged again once the new watch is open.
                st.advanced_at = None;
                st.opened_at = None;
            }
            self.applied.send_replace(0);
            tokio::time::sleep(REOPEN).await;
        }
    }

    fn apply(&self, ev: RawEvent, ttl: Duration) {
        let rev = ev.revision();
        {
            let mut st = self.lock();
            st.advanced_at = Some(tokio::time::Instant::now());
            match ev {
                // An atomic claim's epoch key is no lease.
                RawEvent::Put(e) if e.key.starts_with(super::kv::EPOCH_KEY_PREFIX) => {}
                RawEvent::Put(e) => match LeaseRecord::decode(&e.key, &e.value) {
                    Ok(rec) => {
                        let mut lease = Lease::resolve(rec, e.revision, e.written_at, Some(ttl));
                        lease.resource = e.key;
                        st.index.insert(lease);
                    }
                    Err(err) => {
                        tracing::warn!(key = %e.key, error = %err, "lease view: unreadable record ignored");
                        st.index.remove(&e.key);
                    }
                },
                RawEvent::Delete { key, .. } => {
                    st.index.remove(&key);
                }
            }
        }
        self.applied.send_if_modified(|a| {
            if rev > *a {
                *a = rev;
                true
            } else {
                false
            }
        });
    }

    /// Wait until the view has applied `last`, or `last` is gone (it may
    /// have aged out before the view saw it); a read waiting since `since`
    /// judges the watch as it waits (see [`STALLED`]).
    async fn reach<B: Backend>(
        self: &Arc<Self>,
        backend: &Arc<B>,
        tasks: &Tasks,
        rx: &mut watch::Receiver<Revision>,
        last: Revision,
        since: tokio::time::Instant,
    ) -> Result<(), StoreError> {
        loop {
            let waited = tokio::time::timeout(RECHECK, async {
                rx.wait_for(|a| *a >= last).await.map(|_| ())
            })
            .await;
            match waited {
                Ok(Ok(_)) => return Ok(()),
                Ok(Err(_)) => return Err(StoreError::Unavailable("the lease view stopped".into())),
                Err(_) => {
                    if !backend.revision_exists(BucketId::Leases, last).await? {
                        return Ok(());
                    }
                    self.touch(backend, tasks);
                    self.judge_stall(since);
                }
            }
        }
    }

    /// Bring the view level with the bucket's last write (read from the
    /// leader), then hand `f` the leases it holds. Unbounded: the caller
    /// bounds it with the store timeout.
    ///
    /// A newly opened watch delivers each key's last message in revision
    /// order, then what is written after; a key written again meanwhile
    /// comes only at its new revision, past the last one read — until then
    /// the view lacks that key altogether. So until an opening has once been
    /// found level, a read that reaches the last revision reads it once
    /// more and waits for that too; after that every key is in the view and
    /// reaching the last revision read is enough.
    pub async fn read<B: Backend, T>(
        self: &Arc<Self>,
        backend: &Arc<B>,
        tasks: &Tasks,
        f: impl FnOnce(&ViewIndex) -> T,
    ) -> Result<T, StoreError> {
        self.touch(backend, tasks);
        if let Some(mut last) = backend.last_revision(BucketId::Leases, "").await? {
            let began = std::time::Instant::now();
            let waiting_since = tokio::time::Instant::now();
            let behind = last.saturating_sub(*self.applied.borrow());
            let mut rx = self.applied.subscribe();
            let mut reread = false;
            let mut waiting = Waiting {
                view: self,
                last,
                answered: false,
            };
            loop {
                waiting.last = last;
                self.reach(backend, tasks, &mut rx, last, waiting_since)
                    .await?;
                let opening = {
                    let st = self.lock();
                    (st.settled != st.opened).then_some(st.opened)
                };
                let Some(opening) = opening else {
                    break;
                };
                // Once: a key written again before this re-read lies at or
                // below its answer.
                let again = if reread {
                    None
                } else {
                    reread = true;
                    backend
                        .last_revision(BucketId::Leases, "")
                        .await?
                        .filter(|now| *now > last)
                };
                match again {
                    Some(now) => last = now,
                    None => {
                        let mut st = self.lock();
                        if st.opened == opening {
                            st.settled = opening;
                        }
                        break;
                    }
                }
            }
            waiting.answered = true;
            for u in lag_updates(behind, began.elapsed().as_secs_f64()) {
                m::apply(&u);
            }
        }
        let st = self.lock();
        Ok(f(&st.index))
    }
}

/// A read waiting for the view to be level: told at debug level when its
/// caller gives it up (at the store's bound), with where the view stood —
/// what a claim that timed out on a store that answered has to say.
struct Waiting<'a> {
    view: &'a LeaseView,
    last: Revision,
    answered: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        let st = self.view.lock();
        tracing::debug!(
            waited_for = self.last,
            applied = *self.view.applied.borrow(),
            since_applied_ms = st.advanced_at.map(|t| t.elapsed().as_millis() as u64),
            opened = st.opened,
            settled = st.settled,
            stalled = st.stalled,
            running = st.running,
            "a lease view read was given up before the view was level"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coord::kv::{RawEntry, RawEventStream};
    use crate::coord::lease::{self, LeaseState};
    use std::time::Duration;

    fn lease(resource: &str, protocol: u32, expires: i64) -> Lease {
        Lease {
            resource: resource.into(),
            owner: "n:1".into(),
            epoch: 1,
            acquired_at: StoreTime::from_unix_nanos(0),
            expires_at: StoreTime::from_unix_nanos(expires),
            preferred: "n".into(),
            protocol,
            state: LeaseState::Held,
            metadata: Default::default(),
            revision: 1,
            ttl: Duration::from_secs(1),
            claim: String::new(),
            offer: None,
        }
    }

    /// A leases bucket whose last revision and watch the test scripts.
    struct Scripted {
        last: Mutex<Revision>,
        last_reads: std::sync::atomic::AtomicUsize,
        /// One stream for each opening of the watch, in order.
        events:
            Mutex<std::collections::VecDeque<futures::channel::mpsc::UnboundedReceiver<RawEvent>>>,
        watches: std::sync::atomic::AtomicUsize,
    }

    fn not_scripted() -> StoreError {
        StoreError::Backend("not part of the script".into())
    }

    #[async_trait::async_trait]
    impl Backend for Scripted {
        fn lease_ttl(&self) -> Duration {
            Duration::from_secs(3600)
        }
        fn now(&self) -> StoreTime {
            StoreTime::from_unix_nanos(0)
        }
        fn connection(&self) -> crate::coord::ConnectionState {
            crate::coord::ConnectionState::Connected
        }
        fn connection_changes(&self) -> watch::Receiver<crate::coord::ConnectionState> {
            watch::channel(crate::coord::ConnectionState::Connected).1
        }
        async fn get(&self, _: BucketId, _: &str) -> Result<Option<RawEntry>, StoreError> {
            Err(not_scripted())
        }
        async fn get_marked(
            &self,
            _: BucketId,
            _: &str,
        ) -> Result<(Revision, Option<RawEntry>), StoreError> {
            Err(not_scripted())
        }
        async fn create(
            &self,
            _: BucketId,
            _: &str,
            _: bytes::Bytes,
        ) -> Result<crate::coord::kv::Written, crate::coord::kv::WriteError> {
            Err(crate::coord::kv::WriteError::Unknown(not_scripted()))
        }
        async fn update(
            &self,
            _: BucketId,
            _: &str,
            _: bytes::Bytes,
            _: Revision,
        ) -> Result<crate::coord::kv::Written, crate::coord::kv::WriteError> {
            Err(crate::coord::kv::WriteError::Unknown(not_scripted()))
        }
        async fn delete(
            &self,
            _: BucketId,
            _: &str,
            _: Revision,
        ) -> Result<(), crate::coord::kv::WriteError> {
            Err(crate::coord::kv::WriteError::Unknown(not_scripted()))
        }
        async fn written_at(
            &self,
            _: BucketId,
            _: &str,
            _: Revision,
        ) -> Result<Option<StoreTime>, StoreError> {
            Err(not_scripted())
        }
        async fn last_revision(
            &self,
            _: BucketId,
            _: &str,
        ) -> Result<Option<Revision>, StoreError> {
            self.last_reads
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(Some(*self.last.lock().unwrap()))
        }
        async fn revision_exists(&self, _: BucketId, _: Revision) -> Result<bool, StoreError> {
            Ok(true)
        }
        async fn purge(&self, _: BucketId, _: &str, _: Revision) -> Result<(), StoreError> {
            Err(not_scripted())
        }
        async fn watch(&self, _: BucketId, _: &str) -> Result<RawEventStream, StoreError> {
            self.watches
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let rx = self
                .events
                .lock()
                .unwrap()
                .pop_front()
                .ok_or_else(not_scripted)?;
            Ok(rx.map(Ok).boxed())
        }
    }

    fn put(resource: &str, revision: Revision) -> RawEvent {
        let mut l = lease(resource, 4, i64::MAX);
        l.revision = revision;
        RawEvent::Put(RawEntry {
            key: resource.into(),
            value: LeaseRecord::renewal(&l, "c", None).encode(),
            revision,
            written_at: StoreTime::from_unix_nanos(1),
        })
    }

    /// Node b's presence was the bucket's last write when the read began;
    /// node a's, written before it, was renewed before the view's watch
    /// began, so the watch delivers b's first and a's only after, past the
    /// revision read. The first read waits for a's; a later read of the
    /// same opening asks for the last revision once.
    #[tokio::test(start_paused = true)]
    async fn the_first_read_of_an_opening_waits_for_keys_written_past_the_revision_it_read() {
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let backend = Arc::new(Scripted {
            last: Mutex::new(4),
            last_reads: Default::default(),
            events: Mutex::new([rx].into()),
            watches: Default::default(),
        });
        let view = LeaseView::new(DEFAULT_IDLE);
        let tasks = Tasks::new();
        let keys = |ix: &ViewIndex| ix.leases.keys().cloned().collect::<Vec<_>>();
        let reading = {
            let (view, backend, tasks) = (view.clone(), backend.clone(), tasks.clone());
            tokio::spawn(async move { view.read(&backend, &tasks, keys).await })
        };
        // The read has asked for the last revision (4); a is renewed as 5.
        while backend.last_reads.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        *backend.last.lock().unwrap() = 5;
        tx.unbounded_send(put("node:b", 4)).unwrap();
        // Every task idle: the paused clock runs on; the read must not
        // have answered from a view that lacks a (for less than STALLED:
        // then the watch would be opened again).
        tokio::time::sleep(STALLED / 2).await;
        assert!(!reading.is_finished(), "answered without node a");
        tx.unbounded_send(put("node:a", 5)).unwrap();
        let answer = reading.await.unwrap().unwrap();
        assert_eq!(answer, ["node:a", "node:b"]);
        let before = backend.last_reads.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(
            view.read(&backend, &tasks, keys).await.unwrap(),
            ["node:a", "node:b"]
        );
        assert_eq!(
            backend.last_reads.load(std::sync::atomic::Ordering::SeqCst) - before,
            1,
            "a read of a settled opening reads the last revision once"
        );
        tasks.shutdown().await;
    }

    /// Soak seed 12032 (nats-server 2.9.10): after server restarts a
    /// watch can go silent (the client re-creates its consumer inside the
    /// stream's poll, retrying for ever, with no error) and every gated
    /// claim waited on it until the store's bound. A read that has waited
    /// [`STALLED`] for a write that exists has the watch opened again, and
    /// is answered from the new one.
    #[tokio::test(start_paused = true)]
    async fn a_view_whose_watch_stops_delivering_while_behind_opens_it_again() {
        let (_silent, dead) = futures::channel::mpsc::unbounded();
        let (tx, fresh) = futures::channel::mpsc::unbounded();
        tx.unbounded_send(put("node:a", 5)).unwrap();
        let backend = Arc::new(Scripted {
            last: Mutex::new(5),
            last_reads: Default::default(),
            events: Mutex::new([dead, fresh].into()),
            watches: Default::default(),
        });
        let view = LeaseView::new(DEFAULT_IDLE);
        let tasks = Tasks::new();
        let keys = |ix: &ViewIndex| ix.leases.keys().cloned().collect::<Vec<_>>();
        let answer = tokio::time::timeout(STALLED * 10, view.read(&backend, &tasks, keys))
            .await
            .expect("a read behind a silent watch was never answered");
        assert_eq!(answer.unwrap(), ["node:a"]);
        assert_eq!(
            backend.watches.load(std::sync::atomic::Ordering::SeqCst),
            2,
            "the silent watch was opened again, once"
        );
        tasks.shutdown().await;
    }

    /// The same soak seed, instrumented: the view applied a write every
    /// ~200 ms yet stayed 17–70 revisions behind the bucket for minutes,
    /// so every gated claim timed out. A read that has waited STALLED for a
    /// write that exists has the watch opened again, however busy the
    /// watch is with older writes.
    #[tokio::test(start_paused = true)]
    async fn a_view_that_delivers_but_stays_behind_opens_its_watch_again() {
        let (slow_tx, slow) = futures::channel::mpsc::unbounded();
        let (tx, fresh) = futures::channel::mpsc::unbounded();
        tx.unbounded_send(put("node:a", 50)).unwrap();
        let backend = Arc::new(Scripted {
            last: Mutex::new(50),
            last_reads: Default::default(),
            events: Mutex::new([slow, fresh].into()),
            watches: Default::default(),
        });
        // The first watch delivers older writes, one every 200 ms.
        let trickle = tokio::spawn(async move {
            // For longer than the read may take: never reaching 50.
            for i in 0..1_000 {
                if slow_tx.unbounded_send(put("node:b", 1 + i % 40)).is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        let view = LeaseView::new(DEFAULT_IDLE);
        let tasks = Tasks::new();
        let keys = |ix: &ViewIndex| ix.leases.keys().cloned().collect::<Vec<_>>();
        let answer = tokio::time::timeout(STALLED * 10, view.read(&backend, &tasks, keys))
            .await
            .expect("a read behind a watch that does not keep up was never answered");
        assert_eq!(answer.unwrap(), ["node:a"]);
        assert_eq!(
            backend.watches.load(std::sync::atomic::Ordering::SeqCst),
            2,
            "the lagging watch was opened again, once"
        );
        trickle.abort();
        tasks.shutdown().await;
    }

    #[test]
    fn a_read_sets_the_lag_in_revisions_and_observes_the_catch_up() {
        assert_eq!(
            lag_updates(7, 0.003),
            vec![
                Update::Set {
                    name: m::LEASE_VIEW_LAG,
                    value: 7.0
                },
                Update::observe(m::LEASE_VIEW_CATCH_UP, 0.003),
            ]
        );
    }

    #[test]
    fn indexed_floor_answers_as_the_rule_over_every_lease() {
        let kinds = ["seat:", "node:", "worker:"];
        let mut ix = ViewIndex::default();
        let mut all = BTreeMap::new();
        // A deterministic walk of inserts, overwrites and removals.
        for i in 0u32..600 {
            let key = format!("{}{}", kinds[(i % 3) as usize], i % 37);
            if i % 11 == 0 {
                ix.remove(&key);
                all.remove(&key);
            } else {
                let l = lease(&key, 1 + (i * 7) % 5, i64::from((i * 13) % 50));
                ix.insert(l.clone());
                all.insert(key, l);
            }
            for now in [0, 10, 25, 49, 60] {
                for mine in 1..=6 {
                    let t = StoreTime::from_unix_nanos(now);
                    assert_eq!(
                        ix.protocol_floor(t, mine),
                        lease::protocol_floor(all.values(), t, mine),
                        "step {i}, now {now}, mine {mine}"
                    );
                }
            }
        }
    }
}
