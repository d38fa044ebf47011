//! The queue contract: seat mailboxes, durable subscriptions, and what a
//! handler may answer (Ack, Nak, Defer, Poison).
//!
//! Two backends implement it — [`twin::TwinQueue`], the in-process twin
//! a single node runs, and [`jetstream::JetStreamQueue`] on NATS — and one
//! contract suite (`server/tests/it/queue_contract.rs`) runs against both. The
//! consuming loop itself ([`attach`]) is shared, so holds, quiesce, Defer,
//! the delivery budget and dead letters behave identically by construction;
//! a backend only fetches one message and settles it.
//!
//! Stated behaviour (spec § The unowned seat): a message published to a
//! subject that a subscription covers is kept until that subscription acks
//! it, with nothing attached; a message published to a subject that no
//! subscription covers is dropped at the publish. This module never decides
//! who should consume a seat — that is the lease's job.

pub mod attach;
pub mod jetstream;
pub mod registry;
pub mod twin;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

pub use attach::Attachment;

/// Deliveries a message may spend before it is dead-lettered.
pub const DEFAULT_MAX_DELIVERIES: u64 = 25;
/// How long a fetched message may stay unsettled, unextended, before it is
/// redelivered. Its holder extends it every third of the window while it
/// works on it, so this is how soon a dead or wedged node's mail comes
/// back — not a bound on how long a turn may run.
pub const DEFAULT_ACK_WAIT: Duration = Duration::from_secs(30);

/// `crewlet.agent.{handle}.inbox`
pub fn inbox_subject(handle: &str) -> String {
    format!("crewlet.agent.{handle}.inbox")
}

/// Pure: the seat whose inbox `subject` is (`crewlet.agent.{handle}.inbox`).
pub fn inbox_seat(subject: &str) -> Option<&str> {
    subject
        .strip_prefix("crewlet.agent.")?
        .strip_suffix(".inbox")
        .filter(|h| !h.is_empty() && !h.contains('.'))
}
/// `crewlet.agent.{handle}.control`
pub fn control_subject(handle: &str) -> String {
    format!("crewlet.agent.{handle}.control")
}
/// `crewlet.agent.{handle}.reflect`
pub fn reflect_subject(handle: &str) -> String {
    format!("crewlet.agent.{handle}.reflect")
}
/// `agent-{handle}`: the inbox's durable subscription.
pub fn inbox_group(handle: &str) -> String {
    format!("agent-{handle}")
}
/// `control-{handle}`
pub fn control_group(handle: &str) -> String {
    format!("control-{handle}")
}
/// `reflect-{handle}`
pub fn reflect_group(handle: &str) -> String {
    format!("reflect-{handle}")
}

/// Which of a seat's three mailboxes a subscription is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mailbox {
    Inbox,
    Control,
    Reflect,
}

/// A subscription the seat-mailbox grammar produces: the seat's inbox
/// under `agent-{h}`, its control subject under `control-{h}`, or its
/// reflection subject under `reflect-{h}`. Anything else (another group on
/// a seat's subject) is somebody else's and is `None`.
pub fn seat_mailbox_of(info: &SubscriptionInfo) -> Option<(String, Mailbox)> {
    let (handle, mailbox, group) = seat_subject(&info.subject)?;
    (info.name == group).then_some((handle, mailbox))
}

/// A seat mailbox subject's handle, mailbox and the name of the seat's own
/// subscription on it (`crewlet.agent.{h}.inbox` → `agent-{h}`, …); `None`
/// for any other subject.
pub fn seat_subject(subject: &str) -> Option<(String, Mailbox, String)> {
    let rest = subject.strip_prefix("crewlet.agent.")?;
    let (handle, kind) = rest.rsplit_once('.')?;
    if handle.is_empty() || handle.contains('.') {
        return None;
    }
    let (mailbox, group) = match kind {
        "inbox" => (Mailbox::Inbox, inbox_group(handle)),
        "control" => (Mailbox::Control, control_group(handle)),
        "reflect" => (Mailbox::Reflect, reflect_group(handle)),
        _ => return None,
    };
    Some((handle.to_string(), mailbox, group))
}

/// The settings every subscription is created with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueSettings {
    pub max_deliveries: u64,
    pub ack_wait: Duration,
}

impl Default for QueueSettings {
    fn default() -> Self {
        QueueSettings {
            max_deliveries: DEFAULT_MAX_DELIVERIES,
            ack_wait: DEFAULT_ACK_WAIT,
        }
    }
}

/// A durable subscription: a named competing-consumer group on a subject.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubscriptionSpec {
    pub name: String,
    pub subject: String,
    pub max_deliveries: u64,
    pub ack_wait: Duration,
}

impl SubscriptionSpec {
    pub fn new(name: String, subject: String, s: QueueSettings) -> SubscriptionSpec {
        SubscriptionSpec {
            name,
            subject,
            max_deliveries: s.max_deliveries,
            ack_wait: s.ack_wait,
        }
    }

    /// The seat's three subscriptions: inbox, control, reflect.
    pub fn seat(handle: &str, s: QueueSettings) -> [SubscriptionSpec; 3] {
        [
            SubscriptionSpec::new(inbox_group(handle), inbox_subject(handle), s),
            SubscriptionSpec::new(control_group(handle), control_subject(handle), s),
            SubscriptionSpec::new(reflect_group(handle), reflect_subject(handle), s),
        ]
    }

    /// The settings as a person reads them in a mismatch error.
    pub fn describe(&self) -> String {
        format!(
            "subject {}, max_deliveries {}, ack_wait {}s",
            self.subject,
            self.max_deliveries,
            self.ack_wait.as_secs()
        )
    }

    /// Everything but the ack window is the same: a window changed in the
    /// company file (the shipped default went from 30 minutes to 30 s) is
    /// adopted rather than refused.
    pub fn only_ack_wait_differs(&self, other: &SubscriptionSpec) -> bool {
        self.ack_wait != other.ack_wait
            && self.name == other.name
            && self.subject == other.subject
            && self.max_deliveries == other.max_deliveries
    }
}

/// A subscription as listed by the broker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubscriptionInfo {
    pub name: String,
    pub subject: String,
}

/// One delivery of one message to a handler.
#[derive(Clone, Debug)]
pub struct Delivery {
    pub subscription: String,
    pub subject: String,
    pub payload: Bytes,
    /// 1 on the first delivery; rises by one per redelivery.
    pub delivered: u64,
    /// The message id it was published with, if any.
    pub msg_id: Option<String>,
    /// The message's sequence in its stream.
    pub seq: u64,
}

/// What a handler answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// Done: remove it.
    Ack,
    /// Redeliver it, and keep consuming.
    Nak,
    /// Redeliver it no sooner than this (a NAK with a delay), and keep
    /// consuming: a turn that failed before anything reached outside
    /// comes back after a growing wait, not at once. Zero is [`Nak`].
    ///
    /// [`Nak`]: Disposition::Nak
    Retry(std::time::Duration),
    /// Hand it back at once AND stop consuming until `resume()`: this node
    /// is the wrong one to run it (spec § Deferring a delivery).
    Defer(String),
    /// It can never be handled (it does not decode): dead-letter it now,
    /// never retry.
    Poison(String),
}

/// Why a message was dead-lettered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeadLetterReason {
    /// It had spent its whole delivery budget.
    MaxDeliveries(u64),
    /// It could not be decoded (or was otherwise unhandleable).
    Poison(String),
}

impl std::fmt::Display for DeadLetterReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeadLetterReason::MaxDeliveries(n) => write!(f, "delivered {n} times without success"),
            DeadLetterReason::Poison(why) => write!(f, "unreadable: {why}"),
        }
    }
}

/// A message a person can inspect after the queue gave up on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetter {
    /// The dead letter's own number, to re-publish or discard it by.
    pub id: u64,
    pub subscription: String,
    pub subject: String,
    pub seq: u64,
    pub delivered: u64,
    pub msg_id: Option<String>,
    pub reason: String,
    pub payload: Bytes,
    /// RFC 3339: when it was dead-lettered.
    pub at: String,
}

/// What the queue reports (the node turns these into fleet events).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QueueEvent {
    DeadLettered {
        subscription: String,
        subject: String,
        seq: u64,
        delivered: u64,
        reason: DeadLetterReason,
    },
    Deferred {
        subscription: String,
        subject: String,
        seq: u64,
        reason: String,
    },
    /// A message the broker stranded (stored at `seq`, passed by its
    /// consumer) was taken from the stream by its holder, to be handled
    /// like a delivery.
    Recovered {
        subscription: String,
        subject: String,
        seq: u64,
    },
    /// A publish the broker acknowledged at `seq` but did not keep while a
    /// subscription covers its subject was published again, at `new_seq`.
    Republished {
        subject: String,
        seq: u64,
        new_seq: u64,
    },
}

/// Where queue events go.
pub type EventSink = Arc<dyn Fn(QueueEvent) + Send + Sync>;

/// An event sink that only logs.
pub fn log_events() -> EventSink {
    Arc::new(|e| match e {
        QueueEvent::DeadLettered {
            subscription,
            subject,
            seq,
            delivered,
            reason,
        } => {
            tracing::warn!(%subscription, %subject, seq, delivered, %reason, "message dead-lettered")
        }
        QueueEvent::Deferred {
            subscription,
            reason,
            ..
        } => tracing::info!(%subscription, %reason, "delivery deferred"),
        QueueEvent::Recovered {
            subscription, seq, ..
        } => tracing::warn!(%subscription, seq, "stranded message taken from the stream"),
        QueueEvent::Republished {
            subject,
            seq,
            new_seq,
        } => {
            tracing::warn!(%subject, seq, new_seq, "acknowledged message not kept by the broker; published again")
        }
    })
}

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error(
        "subscription {name} exists with other settings ({existing}); refusing to rewrite it to ({wanted}). Delete it deliberately if the change is intended"
    )]
    SettingsMismatch {
        name: String,
        existing: String,
        wanted: String,
    },
    #[error("no subscription named {0}")]
    NoSuchSubscription(String),
    #[error("subscription {0} already has an attachment on this node")]
    AlreadyAttached(String),
    #[error("cannot create stream {stream}: {message}")]
    Stream { stream: String, message: String },
    #[error(
        "the broker acknowledged a message to {subject} (last at stream sequence {seq}) but did not keep it, {attempts} times; nothing was delivered — send it again",
        attempts = crate::queue::jetstream::KEEP_ATTEMPTS
    )]
    NotKept { subject: String, seq: u64 },
    #[error("the queue did not answer within {0:?}")]
    Timeout(Duration),
    #[error("queue backend error: {0}")]
    Backend(String),
}

/// A handler of deliveries. A panic inside `handle` is caught by the
/// consuming loop and treated as Nak; it never unwinds into the queue.
#[async_trait::async_trait]
pub trait Handler: Send + Sync + 'static {
    async fn handle(&self, delivery: Delivery) -> Disposition;

    /// How many waiting deliveries the loop may hand over at once (a
    /// seat's pending triggers coalesce into one partition). 1: one by one.
    fn batch_limit(&self) -> usize {
        1
    }

    /// Whether the work a delivery carries is known finished. Asked about
    /// mail a broker keeps stored below a subscription's acknowledgement
    /// floor with nothing awaiting an acknowledgement: answered mail it
    /// failed to remove, or mail it never delivered. `Some(true)`: finished
    /// (the stored copy is removed); `Some(false)`: known unfinished (taken
    /// and handled); `None`: cannot say (left where it is).
    async fn answered(&self, _delivery: &Delivery) -> Option<bool> {
        None
    }

    /// Handle several deliveries at once; one disposition per delivery, in
    /// order (a missing one counts as Nak). Only called with more than one
    /// delivery when `batch_limit` is above 1.
    async fn handle_batch(&self, deliveries: Vec<Delivery>) -> Vec<Disposition> {
        let mut out = Vec::with_capacity(deliveries.len());
        for d in deliveries {
            out.push(self.handle(d).await);
        }
        out
    }
}

/// A handler from an async closure.
pub fn handler_fn<F, Fut>(f: F) -> Arc<dyn Handler>
where
    F: Fn(Delivery) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Disposition> + Send + 'static,
{
    struct FnHandler<F>(F);
    #[async_trait::async_trait]
    impl<F, Fut> Handler for FnHandler<F>
    where
        F: Fn(Delivery) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Disposition> + Send + 'static,
    {
        async fn handle(&self, d: Delivery) -> Disposition {
            (self.0)(d).await
        }
    }
    Arc::new(FnHandler(f))
}

/// The queue contract.
#[async_trait::async_trait]
pub trait Queue: Send + Sync + 'static {
    /// Create the subscription if it does not exist, attaching nothing.
    /// Idempotent; an existing subscription with other settings is an
    /// error naming both, never silently rewritten.
    async fn ensure_subscription(&self, spec: &SubscriptionSpec) -> Result<(), QueueError>;
    /// Ensure many subscriptions at once (the boot walk). The default does
    /// them one by one; a backend may read what exists once and create only
    /// what is missing. A failure names the subscription.
    async fn ensure_subscriptions(
        &self,
        specs: &[SubscriptionSpec],
    ) -> Result<(), (String, QueueError)> {
        for s in specs {
            self.ensure_subscription(s)
                .await
                .map_err(|e| (s.name.clone(), e))?;
        }
        Ok(())
    }
    /// Delete a subscription and everything it retains. `false` when there
    /// was none.
    async fn delete_subscription(&self, name: &str) -> Result<bool, QueueError>;
    /// Every subscription (name and subject), for mailbox discovery.
    async fn list_subscriptions(&self) -> Result<Vec<SubscriptionInfo>, QueueError>;
    /// Publish; `msg_id` dedupes within the backend's window. Returns false
    /// for a duplicate the backend recognised.
    async fn publish(
        &self,
        subject: &str,
        msg_id: Option<&str>,
        payload: Bytes,
    ) -> Result<bool, QueueError>;
    /// Start consuming `name` with `holds` already taken (nothing is
    /// fetched until every hold is dropped).
    async fn attach(
        &self,
        name: &str,
        holds: &[&str],
        handler: Arc<dyn Handler>,
    ) -> Result<Attachment, QueueError>;
    /// Messages waiting in a subscription (not yet acked).
    async fn pending(&self, name: &str) -> Result<u64, QueueError>;
    /// The newest dead letters, newest first.
    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, QueueError>;
    /// How many dead letters are kept.
    async fn dead_letter_count(&self) -> Result<u64, QueueError>;
    /// Dead letter `id`, or `None` when there is none (discarded, or aged
    /// out).
    async fn find_dead_letter(&self, id: u64) -> Result<Option<DeadLetter>, QueueError>;
    /// Remove dead letter `id`; `false` when there was none.
    async fn discard_dead_letter(&self, id: u64) -> Result<bool, QueueError>;
}

/// What re-publishing a dead letter did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requeued {
    /// The subject it was published to again (its seat's inbox).
    pub subject: String,
    /// The message id it was published under.
    pub msg_id: String,
    /// `false` when the backend had it already (a re-publish asked twice
    /// within the dedupe window).
    pub published: bool,
}

/// Pure: the message id a dead letter is re-published under — its own,
/// marked with the dead letter's number, so the backend's dedupe window
/// does not drop it as the original, and a re-publish asked twice is one
/// message.
pub fn requeue_msg_id(dead: &DeadLetter) -> String {
    match &dead.msg_id {
        Some(id) => format!("{id}~requeued-{}", dead.id),
        None => format!("{}-{}~requeued-{}", dead.subscription, dead.seq, dead.id),
    }
}

/// Publish dead letter `id` again to the subject it was sent to, then
/// remove it from the dead letters. Nothing is lost on a failure: the
/// dead letter is removed only once the backend has the message again (a
/// failure between the two leaves both, and asking again is deduped).
/// `Ok(None)` when there is no such dead letter.
pub async fn requeue_dead_letter(
    queue: &dyn Queue,
    id: u64,
) -> Result<Option<Requeued>, QueueError> {
    let Some(dead) = queue.find_dead_letter(id).await? else {
        return Ok(None);
    };
    let msg_id = requeue_msg_id(&dead);
    let published = queue
        .publish(&dead.subject, Some(&msg_id), dead.payload.clone())
        .await?;
    queue.discard_dead_letter(id).await?;
    Ok(Some(Requeued {
        subject: dead.subject,
        msg_id,
        published,
    }))
}

/// Does `subject` match the NATS-style `filter` (`*` one token, `>` the rest)?
pub fn subject_matches(filter: &str, subject: &str) -> bool {
    let mut f = filter.split('.');
    let mut s = subject.split('.');
    loop {
        match (f.next(), s.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// Create a seat's three subscriptions (inbox, control, reflect), attaching
/// nothing. The three are created concurrently.
pub async fn ensure_seat_mailboxes(
    q: &dyn Queue,
    handle: &str,
    settings: QueueSettings,
) -> Result<(), QueueError> {
    let specs = SubscriptionSpec::seat(handle, settings);
    let results = futures::future::join_all(specs.iter().map(|s| q.ensure_subscription(s))).await;
    results.into_iter().collect()
}

/// The boot walk (spec § The unowned seat): before it claims anything, a
/// node creates the mailboxes of EVERY seat of the company, not only its
/// share, so no seat's mail is dropped for want of a subscription. What
/// exists is compared, what is missing is created; a subscription that
/// cannot be created fails start-up, naming its seat. Logs a progress line
/// every 500 seats.
pub async fn boot_walk<'a>(
    q: &dyn Queue,
    handles: impl IntoIterator<Item = &'a str>,
    settings: QueueSettings,
) -> Result<usize, (String, QueueError)> {
    let handles: Vec<&str> = handles.into_iter().collect();
    let total = handles.len();
    let started = std::time::Instant::now();
    for (i, chunk) in handles.chunks(500).enumerate() {
        let specs: Vec<SubscriptionSpec> = chunk
            .iter()
            .flat_map(|h| SubscriptionSpec::seat(h, settings))
            .collect();
        q.ensure_subscriptions(&specs).await.map_err(|(name, e)| {
            let seat = name
                .split_once('-')
                .map_or(name.as_str(), |(_, h)| h)
                .to_string();
            (seat, e)
        })?;
        if total > 500 {
            tracing::info!(
                done = (i * 500 + chunk.len()),
                total,
                "creating seat mailboxes"
            );
        }
    }
    tracing::info!(
        seats = total,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "seat mailboxes ready"
    );
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inbox_subject_names_its_seat_and_no_other_subject_does() {
        assert_eq!(inbox_seat(&inbox_subject("ops-1")), Some("ops-1"));
        assert_eq!(inbox_seat("crewlet.agent.ops.control"), None);
        assert_eq!(inbox_seat("crewlet.agent..inbox"), None);
        assert_eq!(inbox_seat("crewlet.agent.a.b.inbox"), None);
        assert_eq!(inbox_seat("other.agent.a.inbox"), None);
    }

    #[test]
    fn a_requeued_dead_letter_keeps_its_message_id_marked_with_its_number() {
        let dead = DeadLetter {
            id: 7,
            subscription: "agent-ops".into(),
            subject: inbox_subject("ops"),
            seq: 42,
            delivered: 3,
            msg_id: Some("evt-1".into()),
            reason: "unreadable".into(),
            payload: Bytes::from_static(b"{}"),
            at: String::new(),
        };
        assert_eq!(requeue_msg_id(&dead), "evt-1~requeued-7");
        let anonymous = DeadLetter {
            msg_id: None,
            ..dead
        };
        assert_eq!(requeue_msg_id(&anonymous), "agent-ops-42~requeued-7");
    }

    #[test]
    fn subjects_match_like_nats() {
        assert!(subject_matches(
            "crewlet.agent.a.inbox",
            "crewlet.agent.a.inbox"
        ));
        assert!(subject_matches(
            "crewlet.agent.*.inbox",
            "crewlet.agent.a.inbox"
        ));
        assert!(subject_matches("crewlet.agent.>", "crewlet.agent.a.inbox"));
        assert!(!subject_matches("crewlet.agent.>", "crewlet.agent"));
        assert!(!subject_matches(
            "crewlet.agent.a.inbox",
            "crewlet.agent.b.inbox"
        ));
        assert!(!subject_matches("crewlet.agent.a", "crewlet.agent.a.inbox"));
    }

    #[test]
    fn only_the_seat_grammar_counts_as_a_seat_mailbox() {
        let i = |name: &str, subject: &str| SubscriptionInfo {
            name: name.into(),
            subject: subject.into(),
        };
        assert_eq!(
            seat_mailbox_of(&i("agent-a", "crewlet.agent.a.inbox")),
            Some(("a".into(), Mailbox::Inbox))
        );
        assert_eq!(
            seat_mailbox_of(&i("control-a", "crewlet.agent.a.control")),
            Some(("a".into(), Mailbox::Control))
        );
        assert_eq!(
            seat_mailbox_of(&i("reflect-a", "crewlet.agent.a.reflect")),
            Some(("a".into(), Mailbox::Reflect))
        );
        assert_eq!(
            seat_mailbox_of(&i("audit-tap", "crewlet.agent.a.inbox")),
            None
        );
        assert_eq!(
            seat_mailbox_of(&i("agent-b", "crewlet.agent.a.inbox")),
            None
        );
        assert_eq!(seat_mailbox_of(&i("agent-a", "crewlet.outbox.a")), None);
    }
}
