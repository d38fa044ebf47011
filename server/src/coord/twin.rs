//! The in-process twin of the coordination store: the buckets a single node
//! runs on (`coordination.type = local`), product code rather than a mock.
//!
//! It owns the buckets' contents in process and behaves as JetStream KV on
//! server 2.9 does, traps included: revisions are one sequence per bucket,
//! every write restarts a key's age, a key that ages out is simply gone (no
//! event, no tombstone), a delete leaves a tombstone that a create may
//! replace, and a watch sends current values and then changes.
//!
//! Its clock is tokio's (`tokio::time::Instant`), so it runs under a paused
//! test clock; it must never read the wall clock after it was built, and
//! never hold its lock across an await.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::broadcast;

use super::kv::{
    Backend, BatchWrite, BucketId, RawEntry, RawEvent, RawEventStream, WriteError, Written,
};
use super::{ConnectionState, Revision, StoreError, StoreTime};

const WATCH_CAPACITY: usize = 65_536;

#[derive(Clone, Debug)]
struct MemEntry {
    value: Bytes,
    revision: Revision,
    written_at: StoreTime,
    deleted: bool,
}

struct MemBucket {
    seq: Revision,
    max_age: Option<Duration>,
    entries: BTreeMap<String, MemEntry>,
    /// Every current write by revision (the bucket's last write, and
    /// whether a revision still exists, without a walk).
    by_rev: BTreeMap<Revision, String>,
    /// When each current write ages out (only with a max age).
    expiry: BTreeSet<(StoreTime, Revision)>,
    tx: broadcast::Sender<RawEvent>,
}

impl MemBucket {
    fn new(max_age: Option<Duration>) -> MemBucket {
        let (tx, _) = broadcast::channel(WATCH_CAPACITY);
        MemBucket {
            seq: 0,
            max_age,
            entries: BTreeMap::new(),
            by_rev: BTreeMap::new(),
            expiry: BTreeSet::new(),
            tx,
        }
    }

    /// Drop every key whose age is up: silently, as 2.9 does.
    fn expire(&mut self, now: StoreTime) {
        while let Some(&(at, rev)) = self.expiry.first() {
            if now < at {
                break;
            }
            self.expiry.pop_first();
            if let Some(key) = self.by_rev.remove(&rev) {
                self.entries.remove(&key);
            }
        }
    }

    fn forget(&mut self, key: &str) {
        if let Some(old) = self.entries.remove(key) {
            self.by_rev.remove(&old.revision);
            if let Some(age) = self.max_age {
                self.expiry
                    .remove(&(old.written_at.plus(age), old.revision));
            }
        }
    }

    fn write(&mut self, key: &str, value: Bytes, now: StoreTime, deleted: bool) -> Revision {
        self.write_kept(key, value, now, deleted, false)
    }

    /// A write; `keep`: exempt from the bucket's age limit (JetStream's
    /// per-message `Nats-TTL: never`).
    fn write_kept(
        &mut self,
        key: &str,
        value: Bytes,
        now: StoreTime,
        deleted: bool,
        keep: bool,
    ) -> Revision {
        self.seq += 1;
        let revision = self.seq;
        self.forget(key);
        self.by_rev.insert(revision, key.to_string());
        if let Some(age) = self.max_age.filter(|_| !keep) {
            self.expiry.insert((now.plus(age), revision));
        }
        self.entries.insert(
            key.to_string(),
            MemEntry {
                value: value.clone(),
                revision,
                written_at: now,
                deleted,
            },
        );
        let event = if deleted {
            RawEvent::Delete {
                key: key.to_string(),
                revision,
                written_at: now,
            }
        } else {
            RawEvent::Put(RawEntry {
                key: key.to_string(),
                value,
                revision,
                written_at: now,
            })
        };
        // Nobody watching is fine.
        let _ = self.tx.send(event);
        revision
    }
}

struct State {
    buckets: HashMap<BucketId, MemBucket>,
}

/// The twin's buckets and clock.
#[derive(Clone)]
pub struct TwinBackend {
    state: Arc<Mutex<State>>,
    ttl: Duration,
    base: StoreTime,
    start: tokio::time::Instant,
    /// Always connected: in process there is nothing to lose.
    connected: Arc<tokio::sync::watch::Sender<ConnectionState>>,
    /// Atomic batch writes offered (`coordination.atomic_claim`).
    atomic: bool,
}

impl TwinBackend {
    /// A fresh, empty store whose leases bucket ages keys out after `lease_ttl`.
    pub fn new(lease_ttl: Duration) -> TwinBackend {
        let base = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| StoreTime::from_unix_nanos(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)))
            .unwrap_or_default();
        let buckets = BucketId::ALL
            .iter()
            .map(|b| (*b, MemBucket::new(b.max_age(lease_ttl))))
            .collect();
        TwinBackend {
            state: Arc::new(Mutex::new(State { buckets })),
            ttl: lease_ttl,
            base,
            start: tokio::time::Instant::now(),
            connected: Arc::new(tokio::sync::watch::channel(ConnectionState::Connected).0),
            atomic: false,
        }
    }

    /// The same store, claiming in one atomic batch write
    /// (`coordination.atomic_claim = true`).
    pub fn with_atomic_claims(mut self, on: bool) -> TwinBackend {
        self.atomic = on;
        self
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock leaves plain data behind; keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Run `f` on bucket `b` after expiring what has aged out.
    fn with<T>(
        &self,
        b: BucketId,
        f: impl FnOnce(&mut MemBucket, StoreTime) -> T,
    ) -> Result<T, StoreError> {
        let now = self.now();
        let mut state = self.lock();
        let bucket = state
            .buckets
            .get_mut(&b)
            .ok_or_else(|| StoreError::Backend(format!("no bucket {}", b.name())))?;
        bucket.expire(now);
        Ok(f(bucket, now))
    }
}

#[async_trait]
impl Backend for TwinBackend {
    fn lease_ttl(&self) -> Duration {
        self.ttl
    }

    fn now(&self) -> StoreTime {
        self.base
            .plus(tokio::time::Instant::now().saturating_duration_since(self.start))
    }

    fn connection(&self) -> ConnectionState {
        ConnectionState::Connected
    }

    fn connection_changes(&self) -> tokio::sync::watch::Receiver<ConnectionState> {
        self.connected.subscribe()
    }

    async fn get(&self, b: BucketId, key: &str) -> Result<Option<RawEntry>, StoreError> {
        self.with(b, |bucket, _| {
            bucket
                .entries
                .get(key)
                .filter(|e| !e.deleted)
                .map(|e| RawEntry {
                    key: key.to_string(),
                    value: e.value.clone(),
                    revision: e.revision,
                    written_at: e.written_at,
                })
        })
    }

    async fn get_marked(
        &self,
        b: BucketId,
        key: &str,
    ) -> Result<(Revision, Option<RawEntry>), StoreError> {
        self.with(b, |bucket, _| match bucket.entries.get(key) {
            None => (0, None),
            Some(e) if e.deleted => (e.revision, None),
            Some(e) => (
                e.revision,
                Some(RawEntry {
                    key: key.to_string(),
                    value: e.value.clone(),
                    revision: e.revision,
                    written_at: e.written_at,
                }),
            ),
        })
    }

    async fn create(&self, b: BucketId, key: &str, value: Bytes) -> Result<Written, WriteError> {
        self.with(b, |bucket, now| match bucket.entries.get(key) {
            Some(e) if !e.deleted => Err(WriteError::Conflict),
            _ => Ok(Written {
                revision: bucket.write(key, value, now, false),
                written_at: Some(now),
                within: None,
            }),
        })
        .map_err(WriteError::Unknown)?
    }

    async fn update(
        &self,
        b: BucketId,
        key: &str,
        value: Bytes,
        expected: Revision,
    ) -> Result<Written, WriteError> {
        self.with(b, |bucket, now| {
            let last = bucket.entries.get(key).map(|e| e.revision).unwrap_or(0);
            if last != expected {
                return Err(WriteError::Conflict);
            }
            Ok(Written {
                revision: bucket.write(key, value, now, false),
                written_at: Some(now),
                within: None,
            })
        })
        .map_err(WriteError::Unknown)?
    }

    fn atomic_claims(&self) -> bool {
        self.atomic
    }

    /// Always read: any twin sharing these buckets may have claimed
    /// atomically, and a read here costs no round trip.
    fn epoch_keys(&self) -> bool {
        true
    }

    async fn batch(&self, b: BucketId, writes: Vec<BatchWrite>) -> Result<Written, WriteError> {
        if !self.atomic {
            return Err(WriteError::Unknown(StoreError::Backend(
                "atomic batch writes are off (coordination.atomic_claim)".into(),
            )));
        }
        self.with(b, |bucket, now| {
            let stale = writes.iter().any(|w| {
                let last = bucket.entries.get(&w.key).map(|e| e.revision).unwrap_or(0);
                last != w.expected
            });
            if stale || writes.is_empty() {
                return Err(WriteError::Conflict);
            }
            let mut revision = 0;
            for w in writes {
                revision = bucket.write_kept(&w.key, w.value, now, false, w.keep);
            }
            Ok(Written {
                revision,
                written_at: Some(now),
                within: None,
            })
        })
        .map_err(WriteError::Unknown)?
    }

    async fn delete(&self, b: BucketId, key: &str, expected: Revision) -> Result<(), WriteError> {
        self.with(b, |bucket, now| {
            let last = bucket.entries.get(key).map(|e| e.revision).unwrap_or(0);
            if last != expected {
                return Err(WriteError::Conflict);
            }
            bucket.write(key, Bytes::new(), now, true);
            Ok(())
        })
        .map_err(WriteError::Unknown)?
    }

    async fn written_at(
        &self,
        b: BucketId,
        key: &str,
        revision: Revision,
    ) -> Result<Option<StoreTime>, StoreError> {
        self.with(b, |bucket, _| {
            bucket
                .entries
                .get(key)
                .filter(|e| e.revision == revision)
                .map(|e| e.written_at)
        })
    }

    async fn last_revision(
        &self,
        b: BucketId,
        scope: &str,
    ) -> Result<Option<Revision>, StoreError> {
        self.with(b, |bucket, _| {
            bucket
                .by_rev
                .iter()
                .rev()
                .find(|(_, k)| k.starts_with(scope))
                .map(|(r, _)| *r)
        })
    }

    async fn revision_exists(&self, b: BucketId, revision: Revision) -> Result<bool, StoreError> {
        self.with(b, |bucket, _| bucket.by_rev.contains_key(&revision))
    }

    async fn purge(&self, b: BucketId, key: &str, through: Revision) -> Result<(), StoreError> {
        self.with(b, |bucket, _| {
            if bucket
                .entries
                .get(key)
                .is_some_and(|e| e.revision <= through)
            {
                bucket.forget(key);
            }
        })
    }

    async fn watch(&self, b: BucketId, prefix: &str) -> Result<RawEventStream, StoreError> {
        let prefix = prefix.to_string();
        let (mut current, rx) = self.with(b, |bucket, _| {
            let current: Vec<RawEvent> = bucket
                .entries
                .iter()
                .filter(|(k, _)| k.starts_with(&prefix))
                .map(|(k, e)| {
                    if e.deleted {
                        RawEvent::Delete {
                            key: k.clone(),
                            revision: e.revision,
                            written_at: e.written_at,
                        }
                    } else {
                        RawEvent::Put(RawEntry {
                            key: k.clone(),
                            value: e.value.clone(),
                            revision: e.revision,
                            written_at: e.written_at,
                        })
                    }
                })
                .collect();
            (current, bucket.tx.subscribe())
        })?;
        current.sort_by_key(RawEvent::revision);
        let snapshot = futures::stream::iter(current.into_iter().map(Ok));
        let updates = futures::stream::unfold(rx, move |mut rx| {
            let prefix = prefix.clone();
            async move {
                loop {
                    match rx.recv().await {
                        Ok(ev) => {
                            let key = match &ev {
                                RawEvent::Put(e) => &e.key,
                                RawEvent::Delete { key, .. } => key,
                            };
                            if key.starts_with(&prefix) {
                                return Some((Ok(ev), rx));
                            }
                        }
                        Err(broadcast::error::RecvError::Lagged(n)) => {
                            return Some((
                                Err(StoreError::Backend(format!(
                                    "watch fell {n} changes behind"
                                ))),
                                rx,
                            ));
                        }
                        Err(broadcast::error::RecvError::Closed) => return None,
                    }
                }
            }
        });
        Ok(snapshot.chain(updates).boxed())
    }
}
