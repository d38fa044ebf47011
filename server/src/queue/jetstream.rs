//! The queue on NATS JetStream: seat mailboxes as durable pull consumers on
//! the interest-retained stream `CREWLET_AGENTS`, dead letters copied to
//! `CREWLET_DEAD`.
//!
//! NATS 2.9 facts this relies on (docs/nats.md): `create_consumer` is
//! create-OR-UPDATE, so settings are compared before anything is created;
//! the server's own max-deliver leaves the message in an interest stream,
//! so the budget is enforced by the shared loop (consumer `max_deliver` is
//! unlimited and the budget is recorded in the consumer's description);
//! Nak(None) redelivers at once; Term drops the message from the stream.
//! Every call is bounded by the configured timeout.

use std::sync::Arc;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, pull};
use async_nats::jetstream::stream::{self, RetentionPolicy, StorageType};
use async_nats::jetstream::{self as js, ErrorCode};
use bytes::Bytes;
use futures::StreamExt;

mod kept;
mod listing;
mod pulling;
mod stranded;
pub mod wakes;

use super::{
    Attachment, DeadLetter, DeadLetterReason, EventSink, Handler, Queue, QueueError,
    SubscriptionInfo, SubscriptionSpec,
};
pub use kept::{
    Covering, KEEP_ATTEMPTS, KEEP_BACKOFF, KEEP_LOOKS, KeepStep, Kept, Published, judge_kept,
    keep_step, kept_copy_id,
};
use pulling::PullSource;
pub use stranded::{PENDING_WINDOWS, may_look_past_pending};

/// The stream every seat mailbox lives on (interest retention).
pub const AGENTS_STREAM: &str = "CREWLET_AGENTS";
/// The subjects the agents stream stores: every mailbox's.
const AGENTS_SUBJECTS: &str = "crewlet.agent.>";
/// Where dead letters are copied for a person to inspect.
pub const DEAD_STREAM: &str = "CREWLET_DEAD";
/// How long a dead letter is kept.
pub const DEAD_LETTER_AGE: Duration = Duration::from_secs(30 * 24 * 3600);
/// The publish dedupe window.
pub const DEDUPE_WINDOW: Duration = Duration::from_secs(120);

/// How many consumers `CREWLET_AGENTS` may hold: every seat's three
/// mailboxes for a company at the role limit, twice over (a company whose
/// seats were all replaced keeps the removed ones' mailboxes through their
/// grace). Set on the stream because nats-server 2.15 gives a stream that
/// sets no limit a default of 1,000 consumers — 333 seats — and reads any
/// value not above zero as "the default".
pub const AGENTS_MAX_CONSUMERS: i32 = 2 * 3 * crate::config::MAX_ROLES as i32;

const DESCRIPTION_PREFIX: &str = "crewlet mailbox; max_deliveries=";

/// Settings of the JetStream queue.
#[derive(Clone, Debug)]
pub struct JetStreamSettings {
    /// Stream replicas (1 on a single server, 3 on a 3-server cluster).
    pub replicas: usize,
    /// Every call returns within this.
    pub timeout: Duration,
}

impl Default for JetStreamSettings {
    fn default() -> Self {
        JetStreamSettings {
            replicas: 1,
            timeout: Duration::from_secs(2),
        }
    }
}

/// The JetStream queue.
#[derive(Clone)]
pub struct JetStreamQueue {
    js: js::Context,
    /// The agents stream, shared by every loop's pull ([`pulling`]).
    agents: Arc<stream::Stream>,
    settings: JetStreamSettings,
    events: EventSink,
    /// The server's JetStream API level (`$JS.API.INFO`; 0 before 2.11).
    api_level: u32,
    /// What ends a waiting pull early ([`wakes`]).
    wakes: wakes::Wakes,
    /// The subjects holding stored mail, for the stranded-mail looks.
    stored: Arc<listing::StoredSubjects>,
}

/// Pure: how often a quiet subscription looks for mail its consumer
/// stranded, on a server of JetStream API `level`. Before level 1 (2.9,
/// 2.10) every 30 s: 2.9's consumers stranded mail after leader changes
/// and 2.10 before 2.10.26 had the same bugs (nats-server #6469, #6526).
/// From level 1 (2.11 and later, fixed) every 5 minutes, as a safety net:
/// a look costs a consumer info and a stream read per subscription.
pub fn stranded_every(level: u32) -> Duration {
    if level >= 1 {
        Duration::from_secs(300)
    } else {
        super::attach::STRANDED_EVERY
    }
}

/// The first nats-server release whose consumers keep track of a delivery
/// awaiting its acknowledgement across a change of their leader
/// (nats-server #6469, #6526, #6519).
pub const LEADER_CHANGE_FIXED_IN: (u64, u64, u64) = (2, 10, 26);

/// Pure: whether a nats-server of `version` (as its INFO says, "2.9.10")
/// is one whose consumers can lose track of a delivery awaiting its
/// acknowledgement when their leader changes — pass their acknowledgement
/// floor over it, so the interest-retained stream removes mail nobody
/// answered (chaos ci profile, seed 1, on 2.9.10: a message delivered to a
/// node killed that instant was never delivered again, gone from the
/// stream's leader, kept by one replica). A version that cannot be read
/// says no.
pub fn loses_track_across_leader_changes(version: &str) -> bool {
    let mut parts = version
        .trim_start_matches('v')
        .split(['.', '-', '+'])
        .map(|p| p.parse::<u64>());
    match (parts.next(), parts.next(), parts.next()) {
        (Some(Ok(major)), Some(Ok(minor)), Some(Ok(patch))) => {
            (major, minor, patch) < LEADER_CHANGE_FIXED_IN
        }
        _ => false,
    }
}

/// The agents stream as made by a node before its consumer limit was set
/// (no limit: `max_consumers` not above zero), given the limit now: on
/// nats-server 2.15 and later such a stream holds 1,000 consumers at most.
/// A server that refuses the change (before 2.15 a stream's limit could not
/// be changed, and no default applied) leaves the stream as it was.
async fn consumers_unbounded(
    js: &js::Context,
    mut agents: stream::Stream,
    timeout: Duration,
) -> Result<stream::Stream, QueueError> {
    let mut config = agents.cached_info().config.clone();
    if config.max_consumers > 0 {
        return Ok(agents);
    }
    config.max_consumers = AGENTS_MAX_CONSUMERS;
    match bounded(timeout, js.update_stream(config)).await? {
        Ok(_) => {
            tracing::info!(
                max_consumers = AGENTS_MAX_CONSUMERS,
                "{AGENTS_STREAM}: consumer limit set"
            );
            agents = bounded(timeout, js.get_stream(AGENTS_STREAM))
                .await?
                .map_err(backend)?;
        }
        Err(e) => {
            tracing::info!(error = %e, "{AGENTS_STREAM}: the server keeps its consumer limit as it is")
        }
    }
    Ok(agents)
}

fn backend(e: impl std::fmt::Display) -> QueueError {
    QueueError::Backend(e.to_string())
}

impl JetStreamQueue {
    /// Create (or find) the streams. A stream that cannot be created is an
    /// error naming it: the node does not start without its mailboxes.
    pub async fn new(
        client: async_nats::Client,
        settings: JetStreamSettings,
        events: EventSink,
    ) -> Result<JetStreamQueue, QueueError> {
        let mut js = js::new(client);
        js.set_timeout(settings.timeout);
        let agents = bounded(
            settings.timeout,
            crate::coord::nats::get_or_create_stream(
                &js,
                stream::Config {
                    name: AGENTS_STREAM.into(),
                    subjects: vec![AGENTS_SUBJECTS.into()],
                    retention: RetentionPolicy::Interest,
                    storage: StorageType::File,
                    duplicate_window: DEDUPE_WINDOW,
                    num_replicas: settings.replicas,
                    max_consumers: AGENTS_MAX_CONSUMERS,
                    ..Default::default()
                },
            ),
        )
        .await?
        .map_err(|e| QueueError::Stream {
            stream: AGENTS_STREAM.into(),
            message: e.to_string(),
        })?;
        let agents = consumers_unbounded(&js, agents, settings.timeout).await?;
        bounded(
            settings.timeout,
            crate::coord::nats::get_or_create_stream(
                &js,
                stream::Config {
                    name: DEAD_STREAM.into(),
                    subjects: vec!["crewlet.dead.>".into()],
                    retention: RetentionPolicy::Limits,
                    storage: StorageType::File,
                    max_age: DEAD_LETTER_AGE,
                    num_replicas: settings.replicas,
                    ..Default::default()
                },
            ),
        )
        .await?
        .map_err(|e| QueueError::Stream {
            stream: DEAD_STREAM.into(),
            message: e.to_string(),
        })?;
        let api_level = crate::jetstream_api::api_level(&js.client(), settings.timeout).await;
        let stored = Arc::new(listing::StoredSubjects::new(
            agents.clone(),
            AGENTS_SUBJECTS,
            settings.timeout,
        ));
        Ok(JetStreamQueue {
            js,
            agents: Arc::new(agents),
            settings,
            events,
            api_level,
            wakes: wakes::Wakes::default(),
            stored,
        })
    }

    /// The queue's wakes (how many reasons it has seen, whether it follows
    /// them).
    pub fn wakes(&self) -> &wakes::Wakes {
        &self.wakes
    }

    /// The server's JetStream API level, as read when the queue opened.
    pub fn api_level(&self) -> u32 {
        self.api_level
    }

    /// Publish once, bounded; the broker's acknowledgement.
    async fn publish_once(
        &self,
        subject: &str,
        msg_id: &str,
        payload: Bytes,
    ) -> Result<js::publish::PublishAck, QueueError> {
        let mut headers = HeaderMap::new();
        if !msg_id.is_empty() {
            headers.insert(
                async_nats::header::NATS_MESSAGE_ID,
                header_text(msg_id).as_str(),
            );
        }
        bounded(self.settings.timeout, async {
            self.js
                .publish_with_headers(subject.to_string(), headers, payload)
                .await?
                .await
        })
        .await?
        .map_err(backend)
    }

    async fn consumer_info(&self, name: &str) -> Result<Option<pull::Config>, QueueError> {
        match bounded(self.settings.timeout, self.agents.consumer_info(name)).await? {
            Ok(info) => Ok(Some(pull::Config {
                durable_name: info.config.durable_name.clone(),
                description: info.config.description.clone(),
                ack_wait: info.config.ack_wait,
                filter_subject: info.config.filter_subject.clone(),
                ..Default::default()
            })),
            Err(e) if info_not_found(&e) => Ok(None),
            Err(e) => Err(backend(e)),
        }
    }
}

impl JetStreamQueue {
    /// An existing mailbox against `spec`: the same is kept, another ack
    /// window adopted, anything else refused.
    async fn settle_existing(
        &self,
        spec: &SubscriptionSpec,
        existing: &pull::Config,
    ) -> Result<(), QueueError> {
        match fit(
            &existing.filter_subject,
            &existing.description,
            existing.ack_wait,
            &wanted(spec),
        ) {
            Fit::Same => Ok(()),
            Fit::OtherWindow => self.adopt_window(spec, existing.ack_wait).await,
            Fit::Other => Err(QueueError::SettingsMismatch {
                name: spec.name.clone(),
                existing: describe_existing(existing),
                wanted: spec.describe(),
            }),
        }
    }

    /// Create a missing mailbox with `action: create`: from 2.10 a consumer
    /// a peer made meanwhile with other settings is refused by the server
    /// instead of silently rewritten (10148), and is then settled as any
    /// existing one; 2.9 ignores the action (the compare before the create
    /// is what guards it there).
    async fn create_mailbox(&self, spec: &SubscriptionSpec) -> Result<(), QueueError> {
        use async_nats::jetstream::stream::ConsumerCreateStrictErrorKind;
        match bounded(
            self.settings.timeout,
            self.agents.create_consumer_strict(wanted(spec)),
        )
        .await?
        {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == ConsumerCreateStrictErrorKind::AlreadyExists => {
                match self.consumer_info(&spec.name).await? {
                    Some(existing) => self.settle_existing(spec, &existing).await,
                    None => Err(backend(e)),
                }
            }
            Err(e) => Err(backend(e)),
        }
    }

    /// Change an existing mailbox's ack window to `spec`'s (an update of
    /// the consumer in place: its position and its pending mail stay).
    async fn adopt_window(
        &self,
        spec: &SubscriptionSpec,
        from: Duration,
    ) -> Result<(), QueueError> {
        tracing::warn!(subscription = %spec.name, from_s = from.as_secs(), to_s = spec.ack_wait.as_secs(), "a mailbox's ack window changes to this node's stream.ack_wait_seconds");
        bounded(
            self.settings.timeout,
            self.agents.create_consumer(wanted(spec)),
        )
        .await?
        .map_err(backend)?;
        Ok(())
    }
}

/// How an existing mailbox's consumer fits the one wanted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fit {
    Same,
    /// Only the ack window differs: adopted in place.
    OtherWindow,
    /// The subject or the delivery budget differs: refused.
    Other,
}

/// Pure: how a consumer with this subject, description (the delivery
/// budget) and ack window fits `want`.
fn fit(
    filter_subject: &str,
    description: &Option<String>,
    ack_wait: Duration,
    want: &pull::Config,
) -> Fit {
    if filter_subject != want.filter_subject || *description != want.description {
        Fit::Other
    } else if ack_wait != want.ack_wait {
        Fit::OtherWindow
    } else {
        Fit::Same
    }
}

fn not_found(e: &async_nats::jetstream::stream::ConsumerError) -> bool {
    matches!(e.kind(), async_nats::jetstream::stream::ConsumerErrorKind::JetStream(j)
        if j.error_code() == ErrorCode::CONSUMER_NOT_FOUND)
}

fn info_not_found(e: &async_nats::jetstream::context::ConsumerInfoError) -> bool {
    use async_nats::jetstream::context::ConsumerInfoErrorKind as K;
    match e.kind() {
        K::NotFound => true,
        K::JetStream(j) => j.error_code() == ErrorCode::CONSUMER_NOT_FOUND,
        _ => false,
    }
}

async fn bounded<F: std::future::Future>(limit: Duration, f: F) -> Result<F::Output, QueueError> {
    tokio::time::timeout(limit, f)
        .await
        .map_err(|_| QueueError::Timeout(limit))
}

fn describe_existing(c: &pull::Config) -> String {
    let max = c
        .description
        .as_deref()
        .and_then(|d| d.strip_prefix(DESCRIPTION_PREFIX))
        .unwrap_or("?");
    format!(
        "subject {}, max_deliveries {}, ack_wait {}s",
        c.filter_subject,
        max,
        c.ack_wait.as_secs()
    )
}

fn wanted(spec: &SubscriptionSpec) -> pull::Config {
    pull::Config {
        durable_name: Some(spec.name.clone()),
        description: Some(format!("{DESCRIPTION_PREFIX}{}", spec.max_deliveries)),
        ack_policy: AckPolicy::Explicit,
        ack_wait: spec.ack_wait,
        // The budget is the shared loop's; the server never gives up alone.
        max_deliver: -1,
        filter_subject: spec.subject.clone(),
        deliver_policy: DeliverPolicy::All,
        num_replicas: 0,
        ..Default::default()
    }
}

#[async_trait::async_trait]
impl Queue for JetStreamQueue {
    async fn ensure_subscription(&self, spec: &SubscriptionSpec) -> Result<(), QueueError> {
        match self.consumer_info(&spec.name).await? {
            Some(existing) => self.settle_existing(spec, &existing).await,
            None => self.create_mailbox(spec).await,
        }
    }

    async fn ensure_subscriptions(
        &self,
        specs: &[SubscriptionSpec],
    ) -> Result<(), (String, QueueError)> {
        // One listing of what exists, then a create for each missing one:
        // the same compare-then-create, without a lookup per subscription.
        let mut existing = std::collections::HashMap::new();
        let mut list = self.agents.consumers();
        let deadline = tokio::time::Instant::now() + self.settings.timeout * 10;
        loop {
            let next = tokio::time::timeout_at(deadline, list.next())
                .await
                .map_err(|_| {
                    (
                        "(listing)".to_string(),
                        QueueError::Timeout(self.settings.timeout * 10),
                    )
                })?;
            match next {
                Some(Ok(info)) => {
                    existing.insert(info.name.clone(), info.config);
                }
                Some(Err(e)) => return Err(("(listing)".to_string(), backend(e))),
                None => break,
            }
        }
        for spec in specs {
            let want = wanted(spec);
            match existing.get(&spec.name) {
                Some(c) => {
                    let found = fit(&c.filter_subject, &c.description, c.ack_wait, &want);
                    if found == Fit::OtherWindow {
                        self.adopt_window(spec, c.ack_wait)
                            .await
                            .map_err(|e| (spec.name.clone(), e))?;
                        continue;
                    }
                    if found == Fit::Other {
                        let existing = pull::Config {
                            description: c.description.clone(),
                            ack_wait: c.ack_wait,
                            filter_subject: c.filter_subject.clone(),
                            ..Default::default()
                        };
                        return Err((
                            spec.name.clone(),
                            QueueError::SettingsMismatch {
                                name: spec.name.clone(),
                                existing: describe_existing(&existing),
                                wanted: spec.describe(),
                            },
                        ));
                    }
                }
                None => {
                    self.create_mailbox(spec)
                        .await
                        .map_err(|e| (spec.name.clone(), e))?;
                }
            }
        }
        Ok(())
    }

    async fn delete_subscription(&self, name: &str) -> Result<bool, QueueError> {
        match bounded(self.settings.timeout, self.agents.delete_consumer(name)).await? {
            Ok(_) => Ok(true),
            Err(e) if not_found(&e) => Ok(false),
            Err(e) => Err(backend(e)),
        }
    }

    async fn list_subscriptions(&self) -> Result<Vec<SubscriptionInfo>, QueueError> {
        let mut list = self.agents.consumers();
        let mut out = Vec::new();
        let deadline = tokio::time::Instant::now() + self.settings.timeout * 10;
        loop {
            let next = tokio::time::timeout_at(deadline, list.next())
                .await
                .map_err(|_| QueueError::Timeout(self.settings.timeout * 10))?;
            match next {
                Some(Ok(info)) => out.push(SubscriptionInfo {
                    name: info.name,
                    subject: info.config.filter_subject,
                }),
                Some(Err(e)) => return Err(backend(e)),
                None => return Ok(out),
            }
        }
    }

    async fn publish(
        &self,
        subject: &str,
        msg_id: Option<&str>,
        payload: Bytes,
    ) -> Result<bool, QueueError> {
        Ok(!self.publish_kept(subject, msg_id, payload).await?.duplicate)
    }

    async fn attach(
        &self,
        name: &str,
        holds: &[&str],
        handler: Arc<dyn Handler>,
    ) -> Result<Attachment, QueueError> {
        let Some(existing) = self.consumer_info(name).await? else {
            return Err(QueueError::NoSuchSubscription(name.to_string()));
        };
        let max = existing
            .description
            .as_deref()
            .and_then(|d| d.strip_prefix(DESCRIPTION_PREFIX))
            .and_then(|n| n.parse().ok())
            .unwrap_or(super::DEFAULT_MAX_DELIVERIES);
        let source = Arc::new(PullSource {
            stream: self.agents.clone(),
            js: self.js.clone(),
            name: name.to_string(),
            filter: existing.filter_subject,
            next_subject: pulling::next_subject(AGENTS_STREAM, name),
            timeout: self.settings.timeout,
            level: self.api_level,
            wakes: self.wakes.clone(),
            own: self.wakes.register(name),
            stored: self.stored.clone(),
            looked_at: std::sync::atomic::AtomicU64::new(u64::MAX),
            pulled_at: std::sync::atomic::AtomicU64::new(u64::MAX),
            inbox: std::sync::Mutex::new(None),
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
        match bounded(self.settings.timeout, self.agents.consumer_info(name)).await? {
            Ok(info) => Ok(info.num_pending + info.num_ack_pending as u64),
            Err(e) if info_not_found(&e) => Err(QueueError::NoSuchSubscription(name.to_string())),
            Err(e) => Err(backend(e)),
        }
    }

    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, QueueError> {
        dead_letters(&self.js, limit, self.settings.timeout).await
    }

    async fn dead_letter_count(&self) -> Result<u64, QueueError> {
        let timeout = self.settings.timeout;
        let mut stream = bounded(timeout, self.js.get_stream(DEAD_STREAM))
            .await?
            .map_err(backend)?;
        let info = bounded(timeout, stream.info()).await?.map_err(backend)?;
        Ok(info.state.messages)
    }

    async fn find_dead_letter(&self, id: u64) -> Result<Option<DeadLetter>, QueueError> {
        let timeout = self.settings.timeout;
        let stream = bounded(timeout, self.js.get_stream(DEAD_STREAM))
            .await?
            .map_err(backend)?;
        match bounded(timeout, stream.get_raw_message(id)).await? {
            Ok(m) => Ok(Some(dead_letter_of(id, m))),
            Err(e)
                if e.kind()
                    == async_nats::jetstream::stream::RawMessageErrorKind::NoMessageFound =>
            {
                Ok(None)
            }
            Err(e) => Err(backend(e)),
        }
    }

    async fn discard_dead_letter(&self, id: u64) -> Result<bool, QueueError> {
        let timeout = self.settings.timeout;
        let stream = bounded(timeout, self.js.get_stream(DEAD_STREAM))
            .await?
            .map_err(backend)?;
        match bounded(timeout, stream.delete_message(id)).await? {
            Ok(deleted) => Ok(deleted),
            // The server words a delete of nothing as a failed delete
            // (10057): it is `false` when the message is indeed not there.
            Err(e) => match e.kind() {
                async_nats::jetstream::stream::DeleteMessageErrorKind::JetStream(_)
                    if self.find_dead_letter(id).await?.is_none() =>
                {
                    Ok(false)
                }
                _ => Err(backend(e)),
            },
        }
    }
}

/// The headers of a dead letter's copy in `CREWLET_DEAD`.
fn dead_letter_headers(
    name: &str,
    subject: &str,
    seq: u64,
    delivered: u64,
    msg_id: Option<&str>,
    reason: &DeadLetterReason,
) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("Crewlet-Subscription", header_text(name).as_str());
    headers.insert("Crewlet-Subject", header_text(subject).as_str());
    headers.insert("Crewlet-Seq", seq.to_string().as_str());
    headers.insert("Crewlet-Delivered", delivered.to_string().as_str());
    headers.insert("Crewlet-Reason", header_text(&reason.to_string()).as_str());
    if let Some(id) = msg_id {
        headers.insert("Crewlet-Msg-Id", header_text(id).as_str());
    }
    headers
}

/// The longest header value the node writes.
const HEADER_CHARS: usize = 1024;

/// Pure: `s` as a header value may carry it: no control byte (a CR or LF
/// would end the header; they become `?`), at most [`HEADER_CHARS`]
/// characters. Whatever a publisher put in a message id or a failure's
/// text, the node's own publishes stay well formed.
pub fn header_text(s: &str) -> String {
    s.chars()
        .take(HEADER_CHARS)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

fn raw_not_found(e: &async_nats::jetstream::stream::RawMessageError) -> bool {
    matches!(
        e.kind(),
        async_nats::jetstream::stream::RawMessageErrorKind::NoMessageFound
    )
}

async fn dead_letters(
    js: &js::Context,
    limit: usize,
    timeout: Duration,
) -> Result<Vec<DeadLetter>, QueueError> {
    let mut stream = bounded(timeout, js.get_stream(DEAD_STREAM))
        .await?
        .map_err(backend)?;
    let info = bounded(timeout, stream.info()).await?.map_err(backend)?;
    let (first, last) = (info.state.first_sequence, info.state.last_sequence);
    let mut out = Vec::new();
    let mut seq = last;
    while seq >= first && seq > 0 && out.len() < limit {
        // A message that aged out or was deleted is skipped.
        if let Ok(m) = bounded(timeout, stream.get_raw_message(seq)).await? {
            out.push(dead_letter_of(seq, m));
        }
        seq -= 1;
    }
    Ok(out)
}

/// The dead letter stored as message `id` of `CREWLET_DEAD`.
fn dead_letter_of(id: u64, m: async_nats::jetstream::message::StreamMessage) -> DeadLetter {
    let h = |k: &str| m.headers.get(k).map(|v| v.to_string());
    DeadLetter {
        id,
        subscription: h("Crewlet-Subscription").unwrap_or_default(),
        subject: h("Crewlet-Subject").unwrap_or_default(),
        seq: h("Crewlet-Seq").and_then(|v| v.parse().ok()).unwrap_or(0),
        delivered: h("Crewlet-Delivered")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        msg_id: h("Crewlet-Msg-Id"),
        reason: h("Crewlet-Reason").unwrap_or_default(),
        at: m
            .time
            .replace_nanosecond(0)
            .ok()
            .and_then(|t| {
                t.format(&time::format_description::well_known::Rfc3339)
                    .ok()
            })
            .unwrap_or_default(),
        payload: m.payload,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stranded_mail_is_looked_for_every_30_s_before_api_level_1_and_every_5_minutes_after() {
        assert_eq!(stranded_every(0), Duration::from_secs(30));
        assert_eq!(stranded_every(1), Duration::from_secs(300));
        assert_eq!(stranded_every(2), Duration::from_secs(300));
    }

    #[test]
    fn servers_before_2_10_26_are_the_ones_that_lose_track_of_a_delivery_across_a_leader_change() {
        for old in [
            "2.9.10",
            "v2.9.25",
            "2.10.7",
            "2.10.25",
            "2.10.25-beta.1",
            "1.4.0",
        ] {
            assert!(loses_track_across_leader_changes(old), "{old}");
        }
        for fixed in ["2.10.26", "2.10.27", "2.11.0", "2.12.8", "2.15.1", "3.0.0"] {
            assert!(!loses_track_across_leader_changes(fixed), "{fixed}");
        }
        for unreadable in ["", "2", "2.x.1", "nightly"] {
            assert!(
                !loses_track_across_leader_changes(unreadable),
                "{unreadable}"
            );
        }
    }
}
