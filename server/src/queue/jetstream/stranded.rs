//! Mail a broker stranded, taken from where it is stored: the look a
//! quiet subscription makes (`PullSource::take_stranded_mail`), when it
//! may go ahead while deliveries await their acknowledgement
//! ([`may_look_past_pending`]), and how what it takes is settled in the
//! stream itself ([`StoredSettle`]: answered, removed; handed back, left;
//! poisonous, copied to `CREWLET_DEAD` and removed).

use std::time::Duration;

use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::{self as js, ErrorCode, stream};
use bytes::Bytes;

use super::pulling::PullSource;
use super::{backend, bounded, dead_letter_headers, raw_not_found};
use crate::queue::attach::{Fetched, Settle};
use crate::queue::{DeadLetterReason, Delivery, Handler, QueueError};
use crate::watchdog::Progress;

impl PullSource {
    /// [`crate::queue::attach::Source::take_stranded`] on JetStream.
    pub(super) async fn take_stranded_mail(
        &self,
        judge: &dyn Handler,
        idle: Duration,
        beat: &Progress<'_>,
    ) -> Result<Option<Vec<Fetched>>, QueueError> {
        // A consumer leader that takes an acknowledgement for a delivery it
        // never heard of moves its pointer past it, and every message its
        // predecessor handed out before that is neither pending nor ever
        // delivered again (NATS 2.9; nats-server PR #6469); the chaos soak
        // also saw a consumer pass every new message of its subject that
        // way, copies put back at the stream's end included. On an interest
        // stream such a message is still stored: this consumer is the only
        // interest in its subject and has not acknowledged it. So the
        // holder takes it from the stream itself, not through the consumer.
        // Above the ack floor being stored is proof enough (with nothing
        // awaiting an acknowledgement every delivery there was
        // acknowledged, which removes it). Below the floor it is not: 2.9
        // also keeps answered mail stored there (nats-server #3612), and the
        // soak saw floors pushed past mail never delivered; the handler's
        // [`Handler::answered`] tells the two apart.
        //
        // A delivery the consumer counts as awaiting an acknowledgement
        // stops the look, since a holder may still be handling it — but
        // only while the broker would still hand it back: 2.9 was seen
        // keeping one pending for minutes, never handing it back, while
        // it passed every new message of the subject (soak seed 12026:
        // five messages on one seat unanswered to the end). Past
        // `PENDING_WINDOWS` ack windows with this loop idle, nothing real
        // is waiting on it.
        //
        // Mail is taken only from where it is stored: a subscription whose
        // subject holds nothing by the queue's listing has nothing to look
        // for ([`super::listing`]).
        if !self.may_hold_stored_mail(beat).await {
            return Ok(Some(Vec::new()));
        }
        let Some((_, top, subject)) = self.quiet_range(idle, beat).await? else {
            return Ok(None);
        };
        let found = self.stored_up_to(top, subject, beat).await?;
        if found.is_empty() {
            return Ok(Some(Vec::new()));
        }
        // An acknowledgement taken a moment ago may not have removed its
        // message from every replica yet: look again after a moment, and
        // take only what is still stored while nothing awaits an
        // acknowledgement. (Mail that was in fact answered is skipped by the
        // completion ledger: one wasted delivery, no effect.)
        beat();
        tokio::time::sleep(STRANDED_SETTLE).await;
        let Some((floor, _, _)) = self.quiet_range(idle + STRANDED_SETTLE, beat).await? else {
            return Ok(None);
        };
        let mut out = Vec::new();
        for m in found {
            if let Some(f) = self.still_stranded(m, floor, judge, beat).await? {
                out.push(f);
            }
        }
        Ok(Some(out))
    }

    /// The messages stored for `subject` up to stream sequence `top`, in
    /// order, at most [`STRANDED_BATCH`].
    async fn stored_up_to(
        &self,
        top: u64,
        subject: String,
        beat: &Progress<'_>,
    ) -> Result<Vec<StreamMessage>, QueueError> {
        let mut found = Vec::new();
        let mut from = 1;
        while from <= top && found.len() < STRANDED_BATCH {
            beat();
            let next = bounded(
                self.timeout,
                self.stream
                    .raw_message_builder()
                    .sequence(from)
                    .next_by_subject(subject.clone())
                    .send(),
            )
            .await?;
            match next {
                Ok(m) if m.sequence <= top => {
                    from = m.sequence + 1;
                    found.push(m);
                }
                Ok(_) => break,
                Err(e) if raw_not_found(&e) => break,
                Err(e) => return Err(backend(e)),
            }
        }
        Ok(found)
    }

    /// `m` as a delivery to take, if it is still stored and — below the
    /// ack `floor` — `judge` says it was never answered; answered mail the
    /// broker kept there is removed.
    async fn still_stranded(
        &self,
        m: StreamMessage,
        floor: u64,
        judge: &dyn Handler,
        beat: &Progress<'_>,
    ) -> Result<Option<Fetched>, QueueError> {
        beat();
        match bounded(self.timeout, self.stream.get_raw_message(m.sequence)).await? {
            Ok(_) => {}
            Err(e) if raw_not_found(&e) => return Ok(None),
            Err(e) => return Err(backend(e)),
        }
        let delivery = Delivery {
            subscription: self.name.clone(),
            subject: m.subject.to_string(),
            payload: m.payload.clone(),
            delivered: 1,
            msg_id: m
                .headers
                .get(async_nats::header::NATS_MESSAGE_ID)
                .map(|v| v.to_string()),
            seq: m.sequence,
        };
        if m.sequence <= floor {
            beat();
            match judge.answered(&delivery).await {
                // Answered mail the broker failed to remove: removed.
                Some(true) => {
                    beat();
                    match bounded(self.timeout, self.stream.delete_message(m.sequence)).await? {
                        Ok(_) => {
                            tracing::debug!(subscription = %self.name, seq = m.sequence, "answered mail the broker kept stored below the ack floor; removed")
                        }
                        Err(e) if delete_not_found(&e) => {}
                        Err(e) => return Err(backend(e)),
                    }
                    return Ok(None);
                }
                Some(false) => {}
                None => return Ok(None),
            }
        }
        let settle = Box::new(StoredSettle {
            stream: self.stream.clone(),
            js: self.js.clone(),
            name: self.name.clone(),
            subject: delivery.subject.clone(),
            seq: delivery.seq,
            msg_id: delivery.msg_id.clone(),
            payload: delivery.payload.clone(),
            timeout: self.timeout,
        });
        Ok(Some(Fetched { delivery, settle }))
    }
}

/// At most this many stranded messages are taken per look.
const STRANDED_BATCH: usize = 4096;
/// How long a look waits before it re-reads what it found stranded.
const STRANDED_SETTLE: Duration = Duration::from_millis(500);

impl PullSource {
    /// May this subscription's subject hold stored mail? A look after a
    /// new reason (its first, a reconnect, a leader change) asks for a
    /// listing made after it began; any other accepts one up to half its
    /// look interval old.
    async fn may_hold_stored_mail(&self, beat: &Progress<'_>) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        let reasons = crate::queue::attach::Source::reasons(self);
        let now = tokio::time::Instant::now();
        let not_before = if self.looked_at.swap(reasons, SeqCst) != reasons {
            now
        } else {
            let half = crate::queue::attach::Source::stranded_every(self) / 2;
            now.checked_sub(half).unwrap_or(now)
        };
        self.stored.may_hold(&self.filter, not_before, beat).await
    }

    /// The consumer's (ack floor, delivered, filter subject) when no
    /// delivery awaits its acknowledgement; `None` otherwise.
    async fn quiet_range(
        &self,
        idle: Duration,
        beat: &Progress<'_>,
    ) -> Result<Option<(u64, u64, String)>, QueueError> {
        beat();
        let info = bounded(self.timeout, self.stream.consumer_info(&self.name))
            .await?
            .map_err(backend)?;
        if !may_look_past_pending(info.num_ack_pending, info.config.ack_wait, idle) {
            return Ok(None);
        }
        if info.num_ack_pending > 0 {
            tracing::info!(
                subscription = %self.name,
                ack_pending = info.num_ack_pending,
                idle_s = idle.as_secs(),
                "deliveries await an acknowledgement the broker has not asked back within {PENDING_WINDOWS} ack windows; looking for stranded mail past them"
            );
        }
        Ok(Some((
            info.ack_floor.stream_sequence,
            info.delivered.stream_sequence,
            info.config.filter_subject.clone(),
        )))
    }
}

/// How many ack windows a delivery may await its acknowledgement, with
/// the holder's loop idle all along, before a stranded-mail look goes on
/// past it: a real one is handed back within one window.
pub const PENDING_WINDOWS: u32 = 2;

/// Pure: may a stranded-mail look go ahead while the consumer counts
/// `ack_pending` deliveries awaiting an acknowledgement? Yes when none
/// does, or when the holder's loop has been `idle` (taking nothing,
/// expecting nothing of its own back) for [`PENDING_WINDOWS`] of the
/// consumer's `ack_wait`: the broker would have handed a real one back by
/// then, to the only loop that asks.
pub fn may_look_past_pending(ack_pending: usize, ack_wait: Duration, idle: Duration) -> bool {
    ack_pending == 0 || idle >= ack_wait * PENDING_WINDOWS
}

/// Settles a stranded message taken from the stream itself: answered, it
/// is removed; handed back, it stays stored (the next look takes it
/// again); dead-lettered, it is copied to `CREWLET_DEAD`, then removed.
pub(super) struct StoredSettle {
    stream: std::sync::Arc<stream::Stream>,
    js: js::Context,
    name: String,
    subject: String,
    seq: u64,
    msg_id: Option<String>,
    payload: Bytes,
    timeout: Duration,
}

impl StoredSettle {
    async fn remove(&self) -> Result<(), QueueError> {
        match bounded(self.timeout, self.stream.delete_message(self.seq)).await? {
            Ok(_) => Ok(()),
            Err(e) if delete_not_found(&e) => Ok(()),
            Err(e) => Err(backend(e)),
        }
    }
}

#[async_trait::async_trait]
impl Settle for StoredSettle {
    async fn ack(self: Box<Self>) -> Result<(), QueueError> {
        self.remove().await
    }

    async fn nak(self: Box<Self>) -> Result<(), QueueError> {
        Ok(())
    }

    /// Left where it is stored for a later look (which is at least
    /// `STRANDED_EVERY` away).
    async fn nak_after(self: Box<Self>, _delay: Duration) -> Result<(), QueueError> {
        Ok(())
    }

    async fn dead_letter(self: Box<Self>, reason: &DeadLetterReason) -> Result<(), QueueError> {
        let headers = dead_letter_headers(
            &self.name,
            &self.subject,
            self.seq,
            1,
            self.msg_id.as_deref(),
            reason,
        );
        bounded(self.timeout, async {
            self.js
                .publish_with_headers(
                    format!("crewlet.dead.{}", self.name),
                    headers,
                    self.payload.clone(),
                )
                .await?
                .await
        })
        .await?
        .map_err(backend)?;
        self.remove().await
    }
}

fn delete_not_found(e: &async_nats::jetstream::stream::DeleteMessageError) -> bool {
    matches!(e.kind(), async_nats::jetstream::stream::DeleteMessageErrorKind::JetStream(j)
        if j.error_code() == ErrorCode::NO_MESSAGE_FOUND)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_look_waits_for_a_pending_delivery_only_while_the_broker_would_still_hand_it_back() {
        let window = Duration::from_secs(30);
        assert!(may_look_past_pending(0, window, Duration::ZERO));
        assert!(!may_look_past_pending(1, window, Duration::ZERO));
        assert!(!may_look_past_pending(1, window, Duration::from_secs(59)));
        assert!(may_look_past_pending(1, window, Duration::from_secs(60)));
        assert!(may_look_past_pending(3, window, Duration::from_secs(600)));
    }
}
