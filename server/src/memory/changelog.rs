//! The memory changelog (spec § A seat's memory follows it): every memory
//! row published on its own subject, `crewlet.memory.{handle}.{table}.{row
//! id}`, on a stream that keeps exactly one message per subject — the
//! current value of every row, not a log of every write.
//!
//! A cycle (every `memory.flush_seconds`) publishes each held seat's rows
//! stamped past the highest change sequence the last cycle published; the
//! release hook flushes once more before the lease goes, so a graceful
//! handoff loses nothing and a crash loses at most one cycle. A cycle that
//! could not publish a seat's rows (the store was away) is tried again
//! within seconds ([`next_flush_in`]), not a whole cycle later, so a store
//! outage widens what a crash can lose only by its own length. The acquire
//! hook replays the seat's subjects into the local store before the inbox
//! attaches ([`hydrate`]); a hydration that fails refuses the seat. Deletes
//! are not replicated. On NATS the stream is `CREWLET_MEMORY`; a single
//! node with no stream keeps it in process.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use async_nats::jetstream::{self as js, consumer, stream};
use futures::StreamExt;

use super::store::{Applied, ApplyError, CarriedRow, MemoryStore};
use crate::metrics::{self as m, Update};

/// The changelog stream.
pub const MEMORY_STREAM: &str = "CREWLET_MEMORY";

/// The first wait before a failed cycle is tried again; it doubles on each
/// failure up to the cycle itself.
pub const FLUSH_RETRY_FIRST: Duration = Duration::from_secs(1);

/// Pure: how long until the next cycle, given the cycle's length, whether
/// the cycle just run left a seat unpublished, the wait before it
/// (`None`: it was a regular cycle) and how long it took. A clean cycle
/// waits what is left of a whole cycle since it began: cycles begin on a
/// fixed cadence, so a slow one (a busy database, a slow store) does not
/// push every later one back and widen what a crash loses past one cycle
/// (chaos ci profile under load: rows 35.8 s old at a crash were not yet
/// published with 30 s cycles). A failed one is tried again after
/// [`FLUSH_RETRY_FIRST`], doubling, never longer than the cycle.
pub fn next_flush_in(
    every: Duration,
    failed: bool,
    last_retry: Option<Duration>,
    took: Duration,
) -> Duration {
    if !failed {
        return every.saturating_sub(took);
    }
    match last_retry {
        None => FLUSH_RETRY_FIRST.min(every),
        Some(w) => (w * 2).min(every),
    }
}

/// `crewlet.memory.{handle}.{table}.{row id}`
pub fn memory_subject(handle: &str, row: &CarriedRow) -> String {
    format!("crewlet.memory.{handle}.{}.{}", row.table.name(), row.id)
}

#[derive(Debug, thiserror::Error)]
pub enum ChangelogError {
    #[error("cannot create the memory changelog {MEMORY_STREAM}: {0}")]
    Stream(String),
    #[error("cannot publish to the memory changelog: {0}")]
    Publish(String),
    #[error("cannot read the memory changelog: {0}")]
    Read(String),
    #[error("the node's memory store: {0}")]
    Db(#[from] sqlx::Error),
}

/// Where memory rows are carried.
#[async_trait::async_trait]
pub trait Changelog: Send + Sync + 'static {
    async fn publish(&self, handle: &str, row: &CarriedRow) -> Result<(), ChangelogError>;
    /// The current value of every row of the seat.
    async fn replay(&self, handle: &str) -> Result<Vec<CarriedRow>, ChangelogError>;
}

/// The in-process changelog of a single node.
#[derive(Default)]
pub struct TwinChangelog {
    subjects: Mutex<BTreeMap<String, CarriedRow>>,
}

impl TwinChangelog {
    pub fn new() -> TwinChangelog {
        TwinChangelog::default()
    }
}

#[async_trait::async_trait]
impl Changelog for TwinChangelog {
    async fn publish(&self, handle: &str, row: &CarriedRow) -> Result<(), ChangelogError> {
        self.subjects
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(memory_subject(handle, row), row.clone());
        Ok(())
    }

    async fn replay(&self, handle: &str) -> Result<Vec<CarriedRow>, ChangelogError> {
        let prefix = format!("crewlet.memory.{handle}.");
        Ok(self
            .subjects
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(s, _)| s.starts_with(&prefix))
            .map(|(_, r)| r.clone())
            .collect())
    }
}

/// The changelog on JetStream.
pub struct NatsChangelog {
    js: js::Context,
    stream: stream::Stream,
    timeout: Duration,
}

impl NatsChangelog {
    /// Create (or find) `CREWLET_MEMORY`.
    pub async fn new(
        client: async_nats::Client,
        replicas: usize,
        timeout: Duration,
    ) -> Result<NatsChangelog, ChangelogError> {
        let mut js = js::new(client);
        js.set_timeout(timeout);
        let stream = tokio::time::timeout(
            timeout,
            crate::coord::nats::get_or_create_stream(
                &js,
                stream::Config {
                    name: MEMORY_STREAM.into(),
                    subjects: vec!["crewlet.memory.>".into()],
                    retention: stream::RetentionPolicy::Limits,
                    storage: stream::StorageType::File,
                    max_messages_per_subject: 1,
                    num_replicas: replicas,
                    ..Default::default()
                },
            ),
        )
        .await
        .map_err(|_| ChangelogError::Stream(format!("no answer within {timeout:?}")))?
        .map_err(|e| ChangelogError::Stream(e.to_string()))?;
        Ok(NatsChangelog {
            js,
            stream,
            timeout,
        })
    }
}

impl NatsChangelog {
    /// Every current row of `filter`, read through one consumer up to the
    /// row at stream sequence `last`; `None` when the consumer ran out
    /// before it (it is served by a member that is behind).
    async fn replay_to(
        &self,
        handle: &str,
        filter: &str,
        last: u64,
    ) -> Result<Option<Vec<CarriedRow>>, ChangelogError> {
        let read = |e: &dyn std::fmt::Display| ChangelogError::Read(e.to_string());
        let c = tokio::time::timeout(
            self.timeout,
            self.stream.create_consumer(consumer::pull::Config {
                filter_subject: filter.to_string(),
                ack_policy: consumer::AckPolicy::None,
                deliver_policy: consumer::DeliverPolicy::All,
                inactive_threshold: Duration::from_secs(30),
                ..Default::default()
            }),
        )
        .await
        .map_err(|_| ChangelogError::Read(format!("no answer within {:?}", self.timeout)))?
        .map_err(|e| read(&e))?;
        // One message per subject, so delivering all is delivering the
        // current value of every row. The end: the leader's last row, or
        // nothing more pending here before it (a member behind).
        let mut out = Vec::new();
        if c.cached_info().num_pending == 0 {
            return Ok(None);
        }
        let mut empty = 0;
        loop {
            let mut batch = c
                .fetch()
                .max_messages(500)
                .expires(Duration::from_millis(500))
                .messages()
                .await
                .map_err(|e| read(&e))?;
            let mut got = 0;
            while let Some(m) = batch.next().await {
                let m = m.map_err(|e| read(&e))?;
                got += 1;
                match serde_json::from_slice::<CarriedRow>(&m.payload) {
                    Ok(r) => out.push(r),
                    // Skipped: one unreadable row must not refuse the
                    // seat on every node.
                    Err(err) => {
                        tracing::warn!(subject = %m.subject, error = %err, "an unreadable memory row; skipped")
                    }
                }
                let info = m.info().map_err(|e| read(&e))?;
                if info.stream_sequence >= last {
                    return Ok(Some(out));
                }
                if info.pending == 0 {
                    return Ok(None);
                }
            }
            if got == 0 {
                empty += 1;
                if empty >= 10 {
                    return Err(ChangelogError::Read(format!(
                        "the replay of seat {handle} stopped after {} rows with more waiting",
                        out.len()
                    )));
                }
            }
        }
    }
}

impl NatsChangelog {
    /// `rows` (a replay of seat `handle`, read through a consumer) with
    /// every row the stream's leader lists for the seat that it lacks, read from the leader one by
    /// one. A consumer served by a member that is catching up can deliver
    /// rows after a gap (the chaos soak saw a drained seat's hydration miss
    /// one episode its giver had published, with later rows present).
    pub async fn complete(
        &self,
        handle: &str,
        mut rows: Vec<CarriedRow>,
    ) -> Result<Vec<CarriedRow>, ChangelogError> {
        let read = |e: &dyn std::fmt::Display| ChangelogError::Read(e.to_string());
        let filter = format!("crewlet.memory.{handle}.>");
        let listed = tokio::time::timeout(self.timeout, async {
            let mut subjects = Vec::new();
            let mut info = self
                .stream
                .info_with_subjects(&filter)
                .await
                .map_err(|e| read(&e))?;
            while let Some(next) = info.next().await {
                subjects.push(next.map_err(|e| read(&e))?.0);
            }
            Ok::<_, ChangelogError>(subjects)
        })
        .await
        .map_err(|_| ChangelogError::Read(format!("no answer within {:?}", self.timeout)))??;
        let delivered: std::collections::BTreeSet<String> =
            rows.iter().map(|r| memory_subject(handle, r)).collect();
        let missing: Vec<String> = listed
            .into_iter()
            .filter(|s| !delivered.contains(s))
            .collect();
        if missing.is_empty() {
            return Ok(rows);
        }
        tracing::warn!(
            seat = handle,
            missing = missing.len(),
            delivered = rows.len(),
            "a memory replay skipped rows the stream's leader holds; reading them from the leader"
        );
        for subject in missing {
            let m = match tokio::time::timeout(
                self.timeout,
                self.stream.get_last_raw_message_by_subject(&subject),
            )
            .await
            .map_err(|_| ChangelogError::Read(format!("no answer within {:?}", self.timeout)))?
            {
                Ok(m) => m,
                // Gone since it was listed: nothing to carry.
                Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => continue,
                Err(e) => return Err(read(&e)),
            };
            match serde_json::from_slice::<CarriedRow>(&m.payload) {
                Ok(r) => rows.push(r),
                Err(err) => {
                    tracing::warn!(subject = %subject, error = %err, "an unreadable memory row; skipped")
                }
            }
        }
        Ok(rows)
    }
}

#[async_trait::async_trait]
impl Changelog for NatsChangelog {
    async fn publish(&self, handle: &str, row: &CarriedRow) -> Result<(), ChangelogError> {
        let body = serde_json::to_vec(row).map_err(|e| ChangelogError::Publish(e.to_string()))?;
        let ack = self
            .js
            .publish(memory_subject(handle, row), body.into())
            .await
            .map_err(|e| ChangelogError::Publish(e.to_string()))?;
        tokio::time::timeout(self.timeout, ack)
            .await
            .map_err(|_| ChangelogError::Publish(format!("no answer within {:?}", self.timeout)))?
            .map_err(|e| ChangelogError::Publish(e.to_string()))?;
        Ok(())
    }

    async fn replay(&self, handle: &str) -> Result<Vec<CarriedRow>, ChangelogError> {
        let read = |e: &dyn std::fmt::Display| ChangelogError::Read(e.to_string());
        let filter = format!("crewlet.memory.{handle}.>");
        // The seat's last row as the stream's leader has it. A consumer may
        // be served by a member that has not caught up yet (one just
        // restarted): its "nothing pending" would leave the rows it has not
        // seen behind — rows a graceful hand-back flushed a moment ago. So
        // the replay ends at this row, never before.
        let last = match tokio::time::timeout(
            self.timeout,
            self.stream.get_last_raw_message_by_subject(&filter),
        )
        .await
        .map_err(|_| ChangelogError::Read(format!("no answer within {:?}", self.timeout)))?
        {
            Ok(m) => m.sequence,
            Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => {
                return Ok(Vec::new());
            }
            Err(e) => return Err(read(&e)),
        };
        let give_up = tokio::time::Instant::now() + self.timeout * 5;
        loop {
            if let Some(rows) = self.replay_to(handle, &filter, last).await? {
                return self.complete(handle, rows).await;
            }
            if tokio::time::Instant::now() >= give_up {
                return Err(ChangelogError::Read(format!(
                    "the replay of seat {handle} never reached the stream's last row (sequence {last})"
                )));
            }
            tracing::debug!(
                seat = handle,
                last,
                "a memory replay read a member that is behind; reading again"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Publish the seat's rows stamped since the last flush. Returns how many.
/// Timed and counted (`crewlet_memory_flush*`).
pub async fn flush(
    store: &MemoryStore,
    log: &dyn Changelog,
    handle: &str,
) -> Result<usize, ChangelogError> {
    let began = std::time::Instant::now();
    let done = flush_rows(store, log, handle).await;
    for u in flush_updates(done.as_ref().ok().copied(), began.elapsed().as_secs_f64()) {
        crate::metrics::apply(&u);
    }
    done
}

/// Pure: what a flush that published `rows` (`None`: it failed) in
/// `seconds` moves.
pub fn flush_updates(rows: Option<usize>, seconds: f64) -> Vec<Update> {
    let mut out = vec![
        Update::count(
            m::MEMORY_FLUSHES,
            "outcome",
            if rows.is_some() { "ok" } else { "failed" },
        ),
        Update::observe(m::MEMORY_FLUSH_DURATION, seconds),
    ];
    if let Some(n) = rows.filter(|n| *n > 0) {
        out.push(Update::Count {
            name: m::MEMORY_FLUSHED_ROWS,
            labels: Vec::new(),
            by: n as u64,
        });
    }
    out
}

async fn flush_rows(
    store: &MemoryStore,
    log: &dyn Changelog,
    handle: &str,
) -> Result<usize, ChangelogError> {
    let last = store.last_published(handle).await?;
    let rows = store.rows_since(handle, last).await?;
    let Some(top) = rows.iter().map(|r| r.seq).max() else {
        return Ok(0);
    };
    for r in &rows {
        log.publish(handle, r).await?;
    }
    store.mark_published(handle, top).await?;
    Ok(rows.len())
}

/// What a hydration did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hydrated {
    pub inserted: usize,
    pub kept_local: usize,
    pub vectors_taken: usize,
    pub replaced: usize,
    pub collided: usize,
    /// Rows that could not be read (named in the log), skipped.
    pub unreadable: usize,
}

/// Replay the seat's subjects into the local store by the spec's rules.
/// An unreachable changelog or an unwritable store is an error (the seat
/// is refused); a row that collides, or that cannot be read, is skipped.
/// Timed and counted (`crewlet_memory_hydrat*`).
pub async fn hydrate(
    store: &MemoryStore,
    log: &dyn Changelog,
    handle: &str,
) -> Result<Hydrated, ChangelogError> {
    let began = std::time::Instant::now();
    let done = hydrate_rows(store, log, handle).await;
    for u in hydrate_updates(done.as_ref().ok(), began.elapsed().as_secs_f64()) {
        crate::metrics::apply(&u);
    }
    done
}

/// Pure: what a hydration that did `h` (`None`: it failed) in `seconds`
/// moves: its outcome, its duration and its rows by result.
pub fn hydrate_updates(h: Option<&Hydrated>, seconds: f64) -> Vec<Update> {
    let mut out = vec![
        Update::count(
            m::MEMORY_HYDRATIONS,
            "outcome",
            if h.is_some() { "ok" } else { "failed" },
        ),
        Update::observe(m::MEMORY_HYDRATE_DURATION, seconds),
    ];
    if let Some(h) = h {
        for (result, n) in [
            ("inserted", h.inserted),
            ("kept_local", h.kept_local),
            ("vector_taken", h.vectors_taken),
            ("replaced", h.replaced),
            ("collided", h.collided),
            ("unreadable", h.unreadable),
        ] {
            if n > 0 {
                out.push(Update::Count {
                    name: m::MEMORY_HYDRATED_ROWS,
                    labels: vec![("result", result.to_string())],
                    by: n as u64,
                });
            }
        }
    }
    out
}

async fn hydrate_rows(
    store: &MemoryStore,
    log: &dyn Changelog,
    handle: &str,
) -> Result<Hydrated, ChangelogError> {
    let rows = log.replay(handle).await?;
    let answers = store
        .apply_carried_all(handle, &rows)
        .await
        .map_err(ChangelogError::Db)?;
    let mut h = Hydrated::default();
    for (r, answer) in rows.iter().zip(answers) {
        match answer {
            Ok(Applied::Inserted) => h.inserted += 1,
            Ok(Applied::KeptLocal) => h.kept_local += 1,
            Ok(Applied::VectorTaken) => h.vectors_taken += 1,
            Ok(Applied::Replaced) => h.replaced += 1,
            Ok(Applied::Collided) => h.collided += 1,
            Err(ApplyError::Db(e)) => return Err(ChangelogError::Db(e)),
            Err(e) => {
                tracing::warn!(seat = handle, table = r.table.name(), id = %r.id, error = %e, "a carried memory row cannot be applied; skipped");
                h.unreadable += 1;
            }
        }
    }
    Ok(h)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_failed_cycle_is_tried_again_within_seconds_backing_off_to_the_cycle() {
        use super::next_flush_in;
        let every = std::time::Duration::from_secs(30);
        let s = std::time::Duration::from_secs;
        let none = std::time::Duration::ZERO;
        assert_eq!(next_flush_in(every, false, None, none), every);
        assert_eq!(next_flush_in(every, true, None, none), s(1));
        assert_eq!(next_flush_in(every, true, Some(s(1)), none), s(2));
        assert_eq!(next_flush_in(every, true, Some(s(16)), none), every);
        assert_eq!(
            next_flush_in(every, false, Some(s(4)), none),
            every,
            "a clean retry goes back to the cycle"
        );
        assert_eq!(
            next_flush_in(s(1) / 2, true, None, none),
            s(1) / 2,
            "never longer than the cycle"
        );
    }

    #[test]
    fn memory_cycles_begin_on_a_fixed_cadence_however_long_one_takes() {
        use super::next_flush_in;
        let every = std::time::Duration::from_secs(30);
        let s = std::time::Duration::from_secs;
        assert_eq!(
            next_flush_in(every, false, None, s(8)),
            s(22),
            "a cycle that took 8 s leaves 22 s to the next one's start"
        );
        assert_eq!(
            next_flush_in(every, false, None, s(45)),
            s(0),
            "a cycle longer than the cadence is followed at once"
        );
        assert_eq!(
            next_flush_in(every, true, Some(s(2)), s(8)),
            s(4),
            "a retry's backoff is a pause after the failure, not a cadence"
        );
    }

    use super::*;

    #[test]
    fn a_flush_counts_its_outcome_and_rows_and_observes_its_duration() {
        assert_eq!(
            flush_updates(Some(3), 0.02),
            vec![
                Update::count(m::MEMORY_FLUSHES, "outcome", "ok"),
                Update::observe(m::MEMORY_FLUSH_DURATION, 0.02),
                Update::Count {
                    name: m::MEMORY_FLUSHED_ROWS,
                    labels: vec![],
                    by: 3
                },
            ]
        );
        // Nothing to publish: no rows counted; a failed flush says so.
        assert_eq!(flush_updates(Some(0), 0.0).len(), 2);
        assert_eq!(
            flush_updates(None, 1.0)[0],
            Update::count(m::MEMORY_FLUSHES, "outcome", "failed")
        );
    }

    #[test]
    fn a_hydration_counts_its_outcome_and_its_rows_by_result() {
        let h = Hydrated {
            inserted: 5,
            collided: 1,
            ..Hydrated::default()
        };
        assert_eq!(
            hydrate_updates(Some(&h), 0.5),
            vec![
                Update::count(m::MEMORY_HYDRATIONS, "outcome", "ok"),
                Update::observe(m::MEMORY_HYDRATE_DURATION, 0.5),
                Update::Count {
                    name: m::MEMORY_HYDRATED_ROWS,
                    labels: vec![("result", "inserted".into())],
                    by: 5
                },
                Update::Count {
                    name: m::MEMORY_HYDRATED_ROWS,
                    labels: vec![("result", "collided".into())],
                    by: 1
                },
            ]
        );
        assert_eq!(
            hydrate_updates(None, 0.1),
            vec![
                Update::count(m::MEMORY_HYDRATIONS, "outcome", "failed"),
                Update::observe(m::MEMORY_HYDRATE_DURATION, 0.1),
            ]
        );
    }
}
