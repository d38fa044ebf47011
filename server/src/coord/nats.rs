//! The coordination store on NATS JetStream KV (`coordination.type =
//! embedded-kv`): the [`Backend`] primitives over the fleet's buckets.
//!
//! It owns the connection (several URLs, user/password or a creds file, TLS
//! when a URL says `tls://`, reconnecting forever), the buckets' streams and
//! the store clock. Buckets are made by creating their `KV_{bucket}` stream
//! ourselves and then opening it with `get_key_value`: async-nats 0.51's
//! `create_key_value` cannot parse server 2.9's account-info reply
//! (docs/nats.md), and pinning 0.40 would hold every other API back.
//!
//! It must never read from a follower (every bucket is made with
//! `allow_direct = false`, so reads go to the stream leader: followers answer
//! stale on R3), never retry a write (a lost answer is reported as unknown
//! and the protocol re-reads), and never let the store clock run ahead of the
//! server: "now" is the latest server timestamp seen plus the local time
//! elapsed since it was received, a lower bound.

use std::collections::HashMap;
use std::future::IntoFuture;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv, stream};
use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::watch;

use super::kv::{
    Backend, BatchWrite, BucketId, RawEntry, RawEvent, RawEventStream, WriteError, Written,
    decode_key, encode_key,
};
use super::{ConnectionState, Revision, StoreError, StoreTime};
use crate::config::{CoordinationSection, StreamSection};

mod connect;

/// Find the stream `config` names, or create it. Nodes started together
/// race to create the same stream; a create that loses answers an error
/// (nats-server 2.9.10: "subjects overlap with an existing stream") while
/// the winner's stream stands, so a failed create is followed by one look
/// for the stream by name before the error is given (three nodes started
/// at once: one failed to start on the outbox stream).
pub async fn get_or_create_stream(
    js: &jetstream::Context,
    config: stream::Config,
) -> Result<stream::Stream, jetstream::context::CreateStreamError> {
    match js.get_or_create_stream(config.clone()).await {
        Ok(s) => Ok(s),
        Err(e) => js.get_stream(&config.name).await.map_err(|_| e),
    }
}

/// How the NATS store is reached and set up.
#[derive(Clone, Debug)]
pub struct NatsOptions {
    pub urls: Vec<String>,
    pub user: Option<String>,
    pub password: Option<String>,
    pub creds_file: Option<PathBuf>,
    /// Certificate authorities a `tls://` server is checked against.
    pub tls_ca_file: Option<PathBuf>,
    /// The configured lease TTL (a bucket a peer created wins).
    pub lease_ttl: Duration,
    /// The bound on every call, and the JetStream request timeout.
    pub store_timeout: Duration,
    /// Replicas for buckets this node creates (1, or 3 on a cluster).
    pub replicas: usize,
    /// The connection's name, as the server's monitoring shows it.
    pub name: String,
    /// Claim in one atomic batch where the server allows it (JetStream API
    /// level 2: nats-server 2.12 and later). Never set from the company file:
    /// the epoch key it keeps with `Nats-TTL: never` does not survive a
    /// server's restart after a crash (docs/nats.md); the contract suite and
    /// the coordination bench set it to exercise and measure the path.
    pub atomic_claim: bool,
}

impl NatsOptions {
    pub fn new(urls: Vec<String>) -> NatsOptions {
        NatsOptions {
            urls,
            user: None,
            password: None,
            creds_file: None,
            tls_ca_file: None,
            lease_ttl: Duration::from_secs(45),
            store_timeout: Duration::from_millis(2000),
            replicas: 1,
            name: "crewlet".into(),
            atomic_claim: false,
        }
    }

    pub fn from_config(
        stream: &StreamSection,
        coord: &CoordinationSection,
        node_id: &str,
    ) -> NatsOptions {
        NatsOptions {
            urls: stream.urls.clone(),
            user: stream.user.clone(),
            password: stream.password.clone(),
            creds_file: stream.creds_file.clone(),
            tls_ca_file: stream.tls_ca_file.clone(),
            lease_ttl: Duration::from_secs(coord.lease_ttl_seconds),
            store_timeout: Duration::from_millis(coord.store_timeout_ms),
            replicas: if stream.urls.len() >= 3 { 3 } else { 1 },
            name: format!("crewlet-{node_id}"),
            // Never from the company file: the configuration refuses
            // `atomic_claim` with embedded-kv (a key kept with `Nats-TTL:
            // never` is lost when a server restarts after a crash).
            atomic_claim: false,
        }
    }
}

/// The store's clock: a lower bound on the server's time, and an upper
/// bound while one is calibrated.
struct Clock {
    origin: Instant,
    /// server_nanos − local_elapsed_nanos, the largest seen; i64::MIN = none.
    offset: AtomicI64,
    /// The upper bound's calibration: a server stamp on a write this
    /// process sent, less the local time when it was sent (the server
    /// stamped it after that), and the local time of the calibration.
    upper: Mutex<Option<(i64, i64)>>,
}

/// An upper bound is trusted this long after its calibration.
const UPPER_FRESH: Duration = Duration::from_secs(60);
/// Allowance for the two clocks' rates differing (1,000 ppm, twice what
/// NTP ever slews), and for timestamp resolution.
const UPPER_DRIFT_DIVISOR: i64 = 1000;
const UPPER_SLACK_NANOS: i64 = 1_000_000;

impl Clock {
    fn new() -> Clock {
        Clock {
            origin: Instant::now(),
            offset: AtomicI64::new(i64::MIN),
            upper: Mutex::new(None),
        }
    }

    /// The server stamped `server` on a write sent at `sent`: the server's
    /// clock then read no more than `server`, as seen from `sent`.
    fn calibrate(&self, server: StoreTime, sent: Instant) {
        let cand = server.unix_nanos().saturating_sub(self.elapsed(sent));
        let at = self.elapsed(Instant::now());
        *self.upper.lock().unwrap_or_else(|p| p.into_inner()) = Some((cand, at));
    }

    /// An upper bound on the server's time now, while the calibration is
    /// fresh; `None` otherwise.
    fn upper_now(&self) -> Option<StoreTime> {
        let (cand, at) = (*self.upper.lock().unwrap_or_else(|p| p.into_inner()))?;
        let now = self.elapsed(Instant::now());
        let since = now.saturating_sub(at);
        if since > i64::try_from(UPPER_FRESH.as_nanos()).unwrap_or(i64::MAX) {
            return None;
        }
        Some(StoreTime::from_unix_nanos(
            now.saturating_add(cand)
                .saturating_add(since / UPPER_DRIFT_DIVISOR)
                .saturating_add(UPPER_SLACK_NANOS),
        ))
    }

    fn elapsed(&self, at: Instant) -> i64 {
        i64::try_from(at.saturating_duration_since(self.origin).as_nanos()).unwrap_or(i64::MAX)
    }

    /// A server timestamp received at `received` (a write stamped no later
    /// than when its answer arrived).
    fn observe(&self, server: StoreTime, received: Instant) {
        let off = server.unix_nanos().saturating_sub(self.elapsed(received));
        self.offset.fetch_max(off, Ordering::Relaxed);
    }

    fn now(&self) -> StoreTime {
        let off = self.offset.load(Ordering::Relaxed);
        if off == i64::MIN {
            // Never observed (the connect probe failed): the local clock.
            let n = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
                .unwrap_or(0);
            return StoreTime::from_unix_nanos(n);
        }
        StoreTime::from_unix_nanos(self.elapsed(Instant::now()).saturating_add(off))
    }
}

/// The JetStream KV backend.
pub struct NatsBackend {
    client: async_nats::Client,
    js: jetstream::Context,
    stores: HashMap<BucketId, kv::Store>,
    ttl: Duration,
    timeout: Duration,
    clock: Arc<Clock>,
    /// Connection changes as the client reports them.
    events: watch::Receiver<ConnectionState>,
    /// Claims are one atomic batch (asked for, and the server allows it).
    atomic: bool,
    /// Epoch keys may exist in the leases bucket (it takes atomic batches
    /// and per-message TTLs: a store claiming atomically switched it so).
    epoch_keys: bool,
    /// Reads made to learn a write's own timestamp.
    stamp_reads: AtomicU64,
}

fn stream_name(b: BucketId) -> String {
    format!("KV_{}", b.name())
}

fn subject_of(b: BucketId, key: &str) -> String {
    format!("$KV.{}.{}", b.name(), encode_key(key))
}

/// The subject filter for a scope (`""` or a prefix ending in `:`).
fn filter_of(scope: &str) -> String {
    match scope.strip_suffix(':') {
        Some(s) if !s.is_empty() => format!("{}.>", encode_key(s)),
        _ => ">".into(),
    }
}

fn jetstream_code<K: Clone + std::fmt::Debug + std::fmt::Display + PartialEq>(
    e: &async_nats::error::Error<K>,
    get: impl Fn(&K) -> Option<&jetstream::Error>,
) -> Option<jetstream::ErrorCode> {
    get(&e.kind()).map(|j| j.error_code())
}

impl NatsBackend {
    /// The underlying client (the queue rides the same connection).
    /// How many reads this backend made to learn a write's own timestamp
    /// (a renewal needs none while the clock's upper bound is calibrated).
    pub fn stamp_reads(&self) -> u64 {
        self.stamp_reads.load(Ordering::Relaxed)
    }

    /// Whether claims are one atomic batch on this store.
    pub fn atomic(&self) -> bool {
        self.atomic
    }

    /// A write to `subject` that landed as `sequence`, sent at `sent` when
    /// the store's clock read `lo`, and the pipelined read of the subject's
    /// last message: its exact stamp when that read saw it; else bounds
    /// when the clock's upper bound is calibrated; else read back by
    /// sequence (which calibrates it).
    async fn written(
        &self,
        b: BucketId,
        sequence: Revision,
        (sent, lo): (Instant, StoreTime),
        last: Option<jetstream::message::StreamMessage>,
    ) -> Written {
        let mut w = Written {
            revision: sequence,
            ..Default::default()
        };
        if let Some(m) = last.filter(|m| m.sequence == sequence) {
            let at = self.observe(m.time);
            self.clock.calibrate(at, sent);
            w.written_at = Some(at);
            return w;
        }
        if let Some(hi) = self.clock.upper_now() {
            w.within = Some((lo, hi));
            return w;
        }
        self.stamp_reads.fetch_add(1, Ordering::Relaxed);
        let Ok(store) = self.store(b) else {
            return w;
        };
        if let Ok(Ok(m)) =
            tokio::time::timeout(self.timeout, store.stream.get_raw_message(sequence)).await
        {
            let at = self.observe(m.time);
            self.clock.calibrate(at, sent);
            w.written_at = Some(at);
        }
        w
    }

    /// The compare-and-set write to `subject`, sent: when (and the store's
    /// clock then), and its acknowledgement on its way.
    async fn send_update(
        &self,
        subject: &str,
        value: Bytes,
        expected: Revision,
    ) -> Result<((Instant, StoreTime), jetstream::context::PublishAckFuture), WriteError> {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(
            async_nats::header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
            async_nats::HeaderValue::from(expected),
        );
        let sent = (Instant::now(), self.clock.now());
        let ack = self
            .js
            .publish_with_headers(subject.to_string(), headers, value)
            .await
            .map_err(|e| self.publish_error(e))?;
        Ok((sent, ack))
    }

    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    pub fn jetstream(&self) -> &jetstream::Context {
        &self.js
    }

    fn store(&self, b: BucketId) -> Result<&kv::Store, StoreError> {
        self.stores
            .get(&b)
            .ok_or_else(|| StoreError::Backend(format!("bucket {} not open", b.name())))
    }

    /// One write to learn the server's time: key `clock` of the epochs
    /// bucket (resource keys always contain a `:`, so it never collides).
    async fn probe_clock(&self) -> Result<(), StoreError> {
        let store = self.store(BucketId::Epochs)?;
        // The bucket keeps one message per key: a peer starting at the same
        // moment can replace this write before it is read back. Its write
        // is as good a reading of the server's clock; try again.
        let mut last = None;
        for _ in 0..10 {
            let sent = Instant::now();
            let rev = store
                .put("clock", Bytes::from_static(b"{}"))
                .await
                .map_err(|e| self.unavailable(e))?;
            match store.stream.get_raw_message(rev).await {
                Ok(m) => {
                    let at = StoreTime::from_offset(m.time);
                    self.clock.observe(at, Instant::now());
                    self.clock.calibrate(at, sent);
                    return Ok(());
                }
                Err(e) => last = Some(e.to_string()),
            }
        }
        Err(StoreError::Unavailable(format!(
            "cannot read the server's clock back: {}",
            last.unwrap_or_default()
        )))
    }

    fn unavailable(&self, e: impl std::fmt::Display) -> StoreError {
        let s = e.to_string();
        if s.contains("timed out") || s.contains("TimedOut") {
            StoreError::Timeout(self.timeout)
        } else {
            StoreError::Unavailable(s)
        }
    }

    fn write_error(&self, e: kv::UpdateError) -> WriteError {
        match e.kind() {
            kv::UpdateErrorKind::WrongLastRevision => WriteError::Conflict,
            kv::UpdateErrorKind::InvalidKey => WriteError::Unknown(StoreError::InvalidKey {
                key: String::new(),
                reason: "not a KV key",
            }),
            kv::UpdateErrorKind::TimedOut => WriteError::Unknown(StoreError::Timeout(self.timeout)),
            kv::UpdateErrorKind::Other => WriteError::Unknown(self.unavailable(e)),
        }
    }

    /// The bucket's last write, from the stream leader's state: the same
    /// cost with ten keys as with ten thousand (a wildcard last-by-subject
    /// read walks every subject). A stream holding no message is an empty
    /// bucket; one holding any still holds its newest message (the newest
    /// write ages out last), so the sequence named is never one a reader
    /// waits on for ever; the view re-checks that it exists regardless.
    async fn last_in_stream(&self, b: BucketId) -> Result<Option<Revision>, StoreError> {
        #[derive(serde::Deserialize)]
        struct Reply {
            #[serde(default)]
            state: Option<StreamState>,
            #[serde(default)]
            error: Option<serde_json::Value>,
        }
        #[derive(serde::Deserialize)]
        struct StreamState {
            messages: u64,
            last_seq: u64,
        }
        let subject = format!("{}.STREAM.INFO.{}", self.js_prefix(), stream_name(b));
        let reply = tokio::time::timeout(self.timeout, self.client.request(subject, Bytes::new()))
            .await
            .map_err(|_| StoreError::Timeout(self.timeout))?
            .map_err(|e| self.unavailable(e))?;
        let r: Reply = serde_json::from_slice(&reply.payload)
            .map_err(|e| StoreError::Backend(format!("stream info: {e}")))?;
        if let Some(err) = r.error {
            return Err(StoreError::Unavailable(format!("stream info: {err}")));
        }
        let st = r
            .state
            .ok_or_else(|| StoreError::Backend("stream info without state".into()))?;
        Ok((st.messages > 0).then_some(st.last_seq))
    }

    fn js_prefix(&self) -> &str {
        "$JS.API"
    }

    fn publish_error(&self, e: jetstream::context::PublishError) -> WriteError {
        match e.kind() {
            jetstream::context::PublishErrorKind::WrongLastSequence => WriteError::Conflict,
            jetstream::context::PublishErrorKind::TimedOut => {
                WriteError::Unknown(StoreError::Timeout(self.timeout))
            }
            _ => WriteError::Unknown(self.unavailable(e)),
        }
    }

    fn observe(&self, t: time::OffsetDateTime) -> StoreTime {
        let at = StoreTime::from_offset(t);
        self.clock.observe(at, Instant::now());
        at
    }
}

/// The JetStream API level from which a stream takes atomic batches and
/// per-message TTLs (nats-server 2.12).
pub const ATOMIC_API_LEVEL: u32 = 2;

#[async_trait]
impl Backend for NatsBackend {
    fn lease_ttl(&self) -> Duration {
        self.ttl
    }

    fn now(&self) -> StoreTime {
        self.clock.now()
    }

    fn connection(&self) -> ConnectionState {
        match self.client.connection_state() {
            async_nats::connection::State::Connected => ConnectionState::Connected,
            async_nats::connection::State::Disconnected => ConnectionState::Disconnected,
            async_nats::connection::State::Pending => ConnectionState::Pending,
        }
    }

    fn connection_changes(&self) -> watch::Receiver<ConnectionState> {
        self.events.clone()
    }

    async fn get(&self, b: BucketId, key: &str) -> Result<Option<RawEntry>, StoreError> {
        let entry = self
            .store(b)?
            .entry(encode_key(key))
            .await
            .map_err(|e| self.unavailable(e))?;
        Ok(entry.and_then(|e| match e.operation {
            kv::Operation::Put => {
                let written_at = self.observe(e.created);
                Some(RawEntry {
                    key: key.to_string(),
                    value: e.value,
                    revision: e.revision,
                    written_at,
                })
            }
            kv::Operation::Delete | kv::Operation::Purge => None,
        }))
    }

    async fn get_marked(
        &self,
        b: BucketId,
        key: &str,
    ) -> Result<(Revision, Option<RawEntry>), StoreError> {
        let entry = self
            .store(b)?
            .entry(encode_key(key))
            .await
            .map_err(|e| self.unavailable(e))?;
        Ok(match entry {
            None => (0, None),
            Some(e) => match e.operation {
                kv::Operation::Put => {
                    let written_at = self.observe(e.created);
                    (
                        e.revision,
                        Some(RawEntry {
                            key: key.to_string(),
                            value: e.value,
                            revision: e.revision,
                            written_at,
                        }),
                    )
                }
                kv::Operation::Delete | kv::Operation::Purge => (e.revision, None),
            },
        })
    }

    async fn create(&self, b: BucketId, key: &str, value: Bytes) -> Result<Written, WriteError> {
        let store = self.store(b).map_err(WriteError::Unknown)?;
        let k = encode_key(key);
        match store.update(&k, value.clone(), 0).await {
            Ok(revision) => {
                return Ok(Written {
                    revision,
                    ..Default::default()
                });
            }
            Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {}
            Err(e) => return Err(self.write_error(e)),
        }
        // Present: only a tombstone may be replaced, by a compare-and-set on
        // the tombstone's own revision (so two creators cannot both win).
        match store.entry(&k).await {
            Ok(Some(kv::Entry {
                operation: kv::Operation::Delete | kv::Operation::Purge,
                revision,
                ..
            })) => store
                .update(&k, value, revision)
                .await
                .map(|revision| Written {
                    revision,
                    ..Default::default()
                })
                .map_err(|e| self.write_error(e)),
            Ok(_) => Err(WriteError::Conflict),
            Err(e) => Err(WriteError::Unknown(self.unavailable(e))),
        }
    }

    async fn update(
        &self,
        b: BucketId,
        key: &str,
        value: Bytes,
        expected: Revision,
    ) -> Result<Written, WriteError> {
        let store = self.store(b).map_err(WriteError::Unknown)?;
        store
            .update(encode_key(key), value, expected)
            .await
            .map(|revision| Written {
                revision,
                ..Default::default()
            })
            .map_err(|e| self.write_error(e))
    }

    /// The compare-and-set write, and pipelined right behind it on the same
    /// connection a read of the key's last message from the leader. On a
    /// single server the two are handled in order, so the read sees the
    /// write and gives its timestamp without a second round trip; when it
    /// does not (a replicated stream stores the write later), the caller
    /// reads the write by its revision.
    async fn update_stamped(
        &self,
        b: BucketId,
        key: &str,
        value: Bytes,
        expected: Revision,
    ) -> Result<Written, WriteError> {
        let store = self.store(b).map_err(WriteError::Unknown)?;
        let subject = subject_of(b, key);
        let (sent, ack) = self.send_update(&subject, value, expected).await?;
        let (ack, last) = tokio::join!(
            ack.into_future(),
            store.stream.get_last_raw_message_by_subject(&subject)
        );
        let ack = ack.map_err(|e| self.publish_error(e))?;
        Ok(self.written(b, ack.sequence, sent, last.ok()).await)
    }

    /// While the clock's upper bound is calibrated, the write alone: its
    /// answer's bounds stand for its stamp, and a renewal costs the broker
    /// its write and nothing more. Once the calibration is stale, the
    /// write with its pipelined read ([`Backend::update_stamped`]), which
    /// calibrates it again — one read a node every `UPPER_FRESH`.
    async fn update_renewal(
        &self,
        b: BucketId,
        key: &str,
        value: Bytes,
        expected: Revision,
    ) -> Result<Written, WriteError> {
        if self.clock.upper_now().is_none() {
            return self.update_stamped(b, key, value, expected).await;
        }
        let (sent, ack) = self
            .send_update(&subject_of(b, key), value, expected)
            .await?;
        let ack = ack.await.map_err(|e| self.publish_error(e))?;
        Ok(self.written(b, ack.sequence, sent, None).await)
    }

    fn atomic_claims(&self) -> bool {
        self.atomic
    }

    fn epoch_keys(&self) -> bool {
        self.epoch_keys
    }

    /// An atomic batch (ADR-50): every write but the last published with
    /// the batch's id and sequence and no reply; the last commits it and
    /// is answered for the whole batch. A stale precondition anywhere
    /// stores nothing (`wrong last sequence`: a conflict).
    async fn batch(&self, b: BucketId, writes: Vec<BatchWrite>) -> Result<Written, WriteError> {
        use async_nats::header;
        if !self.atomic {
            return Err(WriteError::Unknown(StoreError::Backend(
                "atomic batch writes are off (coordination.atomic_claim)".into(),
            )));
        }
        let n = writes.len();
        let Some(last_key) = writes.last().map(|w| w.key.clone()) else {
            return Err(WriteError::Conflict);
        };
        let store = self.store(b).map_err(WriteError::Unknown)?;
        let id = {
            use rand::Rng;
            let r: u128 = rand::thread_rng().r#gen();
            format!("{r:032x}")
        };
        let sent = (Instant::now(), self.clock.now());
        let mut ack = None;
        for (i, w) in writes.into_iter().enumerate() {
            let mut h = async_nats::HeaderMap::new();
            h.insert(header::NATS_BATCH_ID, id.as_str());
            h.insert(header::NATS_BATCH_SEQUENCE, (i + 1).to_string().as_str());
            h.insert(
                header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
                async_nats::HeaderValue::from(w.expected),
            );
            if w.keep {
                h.insert(header::NATS_MESSAGE_TTL, "never");
            }
            let subject = subject_of(b, &w.key);
            if i + 1 < n {
                self.client
                    .publish_with_headers(subject, h, w.value)
                    .await
                    .map_err(|e| WriteError::Unknown(self.unavailable(e)))?;
            } else {
                h.insert(header::NATS_BATCH_COMMIT, header::NATS_BATCH_COMMIT_FINAL);
                ack = Some(
                    self.js
                        .publish_with_headers(subject, h, w.value)
                        .await
                        .map_err(|e| self.publish_error(e))?,
                );
            }
        }
        let Some(ack) = ack else {
            return Err(WriteError::Conflict);
        };
        let subject = subject_of(b, &last_key);
        let (ack, last) = tokio::join!(
            ack.into_future(),
            store.stream.get_last_raw_message_by_subject(&subject)
        );
        let ack = ack.map_err(|e| self.publish_error(e))?;
        Ok(self.written(b, ack.sequence, sent, last.ok()).await)
    }

    async fn delete(&self, b: BucketId, key: &str, expected: Revision) -> Result<(), WriteError> {
        let store = self.store(b).map_err(WriteError::Unknown)?;
        store
            .delete_expect_revision(encode_key(key), Some(expected))
            .await
            .map_err(|e| self.write_error(e))
    }

    async fn written_at(
        &self,
        b: BucketId,
        key: &str,
        revision: Revision,
    ) -> Result<Option<StoreTime>, StoreError> {
        let store = self.store(b)?;
        self.stamp_reads.fetch_add(1, Ordering::Relaxed);
        match store.stream.get_raw_message(revision).await {
            Ok(m) if m.subject.as_str() == subject_of(b, key) => Ok(Some(self.observe(m.time))),
            Ok(_) => Ok(None),
            Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(self.unavailable(e)),
        }
    }

    async fn last_revision(
        &self,
        b: BucketId,
        scope: &str,
    ) -> Result<Option<Revision>, StoreError> {
        if scope.is_empty() {
            return self.last_in_stream(b).await;
        }
        // Under a scope: the last message on the scope's subjects (the server
        // walks the bucket's subjects for a wildcard, which a list does anyway).
        let store = self.store(b)?;
        let subject = format!("$KV.{}.{}", b.name(), filter_of(scope));
        match store.stream.get_last_raw_message_by_subject(&subject).await {
            Ok(m) => {
                self.observe(m.time);
                Ok(Some(m.sequence))
            }
            Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(self.unavailable(e)),
        }
    }

    async fn revision_exists(&self, b: BucketId, revision: Revision) -> Result<bool, StoreError> {
        match self.store(b)?.stream.get_raw_message(revision).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => Ok(false),
            Err(e) => Err(self.unavailable(e)),
        }
    }

    async fn purge(&self, b: BucketId, key: &str, through: Revision) -> Result<(), StoreError> {
        // A stream purge of the key's subject below `through + 1`: the
        // marker and anything older go, a write made since stays.
        self.store(b)?
            .stream
            .purge()
            .filter(subject_of(b, key))
            .sequence(through.saturating_add(1))
            .await
            .map(|_| ())
            .map_err(|e| self.unavailable(e))
    }

    async fn watch(&self, b: BucketId, scope: &str) -> Result<RawEventStream, StoreError> {
        let watch = self
            .store(b)?
            .watch_with_history(filter_of(scope))
            .await
            .map_err(|e| self.unavailable(e))?;
        let clock = Arc::clone(&self.clock);
        Ok(watch
            .filter_map(move |res| {
                let out = match res {
                    Err(e) => Some(Err(StoreError::Unavailable(e.to_string()))),
                    Ok(e) => match decode_key(&e.key) {
                        None => None,
                        Some(key) => match e.operation {
                            kv::Operation::Put => {
                                let at = StoreTime::from_offset(e.created);
                                clock.observe(at, Instant::now());
                                Some(Ok(RawEvent::Put(RawEntry {
                                    key,
                                    value: e.value,
                                    revision: e.revision,
                                    written_at: at,
                                })))
                            }
                            kv::Operation::Delete | kv::Operation::Purge => {
                                Some(Ok(RawEvent::Delete {
                                    key,
                                    revision: e.revision,
                                    written_at: StoreTime::from_offset(e.created),
                                }))
                            }
                        },
                    },
                };
                futures::future::ready(out)
            })
            .boxed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_never_runs_ahead_of_what_the_server_stamped() {
        let c = Clock::new();
        let t0 = Instant::now();
        c.observe(StoreTime::from_unix_nanos(1_000_000_000_000), t0);
        let n1 = c.now();
        assert!(n1 >= StoreTime::from_unix_nanos(1_000_000_000_000));
        // An older stamp received later loosens nothing.
        c.observe(StoreTime::from_unix_nanos(5), Instant::now());
        assert!(c.now() >= n1);
    }

    #[test]
    fn scopes_map_to_subject_filters() {
        assert_eq!(filter_of(""), ">");
        assert_eq!(filter_of("seat:"), "seat.>");
        assert_eq!(
            subject_of(BucketId::Leases, "seat:alice"),
            "$KV.crewlet_leases.seat.alice"
        );
    }
}
