//! A mailbox's dispatch loop on JetStream: its pull ([`PullSource`], one
//! message at a time, waiting as long as the queue's wakes allow) and how a
//! delivery it fetched is settled ([`PullSettle`]: acknowledged, handed
//! back, extended, dropped).
//!
//! A pull is a request to the consumer's `MSG.NEXT` subject answered on
//! the loop's inbox. The inbox is kept from one pull to the next while
//! every pull sent to it was answered — a message, or the server's own
//! "request timeout" — so an idle mailbox costs one request a wait, not a
//! subscription made and dropped with each. A pull that ends any other way
//! (a wake, the loop's own deadline, its future dropped at detach, an
//! error) drops its inbox with it: the request it sent may still be
//! waiting at the consumer, and the server discards a waiting request
//! whose inbox nobody listens to, so mail is never sent where no pull
//! waits for it.

use std::time::Duration;

use async_nats::jetstream::consumer::pull::BatchConfig;
use async_nats::jetstream::{self as js, AckKind, stream};
use async_nats::{StatusCode, Subject};
use futures::StreamExt;

use super::{backend, bounded, dead_letter_headers, listing, wakes};
use crate::queue::attach::{Fetched, Settle, Source};
use crate::queue::{DeadLetterReason, Delivery, Handler, QueueError};
use crate::watchdog::Progress;

pub(super) struct PullSource {
    /// The agents stream, shared by every loop of the queue.
    pub(super) stream: std::sync::Arc<stream::Stream>,
    pub(super) js: js::Context,
    pub(super) name: String,
    /// The consumer's filter subject (its mailbox).
    pub(super) filter: String,
    /// Where this consumer's pull requests go ([`next_subject`]).
    pub(super) next_subject: Subject,
    pub(super) timeout: Duration,
    /// The server's JetStream API level.
    pub(super) level: u32,
    pub(super) wakes: wakes::Wakes,
    /// This consumer's own reasons ([`wakes::Wakes::register`]).
    pub(super) own: wakes::Own,
    /// The queue's listing of the subjects holding stored mail.
    pub(super) stored: std::sync::Arc<listing::StoredSubjects>,
    /// The reasons seen at this source's last stranded-mail look (`u64::MAX`
    /// before its first).
    pub(super) looked_at: std::sync::atomic::AtomicU64,
    /// The reasons seen at this source's last long pull (`u64::MAX` before
    /// its first): [`wakes::pull_wait_after`].
    pub(super) pulled_at: std::sync::atomic::AtomicU64,
    /// The inbox whose every pull was answered, kept for the next pull.
    pub(super) inbox: std::sync::Mutex<Option<Inbox>>,
}

/// Pure: the subject a pull request for `consumer` of `stream` goes to.
pub(super) fn next_subject(stream: &str, consumer: &str) -> Subject {
    Subject::from(format!(
        "{}.CONSUMER.MSG.NEXT.{stream}.{consumer}",
        crate::jetstream_api::API_PREFIX
    ))
}

/// A loop's pull inbox: the subscription its pulls are answered on.
pub(super) struct Inbox {
    subject: Subject,
    answers: async_nats::Subscriber,
}

/// What one answer on an inbox means for the pull that waits on it.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Answer {
    /// A message: the pull is done and its inbox may be kept.
    Mail,
    /// The server ended the pull with nothing (its request expired, or
    /// found nothing): the inbox may be kept.
    Ended,
    /// Not an end of the pull (an idle heartbeat): keep waiting.
    NotYet,
    /// The server refused or dropped the request (a 409, a 400, …): the
    /// pull fails and its inbox goes.
    Refused,
}

/// Pure: what an answer with `status` (none for a message) means.
pub(super) fn answer_of(status: Option<StatusCode>) -> Answer {
    match status.unwrap_or(StatusCode::OK) {
        StatusCode::OK => Answer::Mail,
        StatusCode::TIMEOUT | StatusCode::NOT_FOUND => Answer::Ended,
        StatusCode::IDLE_HEARTBEAT => Answer::NotYet,
        _ => Answer::Refused,
    }
}

impl PullSource {
    /// The kept inbox, or a new one.
    async fn inbox(&self) -> Result<Inbox, QueueError> {
        let kept = self.inbox.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(inbox) = kept {
            return Ok(inbox);
        }
        let client = self.js.client();
        let subject = Subject::from(client.new_inbox());
        let answers = bounded(self.timeout, client.subscribe(subject.clone()))
            .await?
            .map_err(backend)?;
        Ok(Inbox { subject, answers })
    }

    /// Keep `inbox` for the next pull: every pull sent to it was answered.
    fn keep(&self, inbox: Inbox) {
        *self.inbox.lock().unwrap_or_else(|p| p.into_inner()) = Some(inbox);
    }

    /// Send one pull request for a single message, waiting up to `wait` at
    /// the consumer, answered on `inbox`.
    async fn request(&self, inbox: &Inbox, wait: Duration) -> Result<(), QueueError> {
        let ask = BatchConfig {
            batch: 1,
            expires: Some(wait),
            ..Default::default()
        };
        let payload = serde_json::to_vec(&ask).map_err(backend)?;
        bounded(
            self.timeout,
            self.js.client().publish_with_reply(
                self.next_subject.clone(),
                inbox.subject.clone(),
                payload.into(),
            ),
        )
        .await?
        .map_err(backend)
    }

    /// The answer to the pull sent to `inbox`, waiting at most `limit`:
    /// `None` when none came in time (the inbox is then not to be kept).
    async fn answer(
        inbox: &mut Inbox,
        limit: Duration,
    ) -> Result<Option<async_nats::Message>, QueueError> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let Ok(Some(m)) = tokio::time::timeout_at(deadline, inbox.answers.next()).await else {
                return Ok(None);
            };
            match answer_of(m.status) {
                Answer::NotYet => continue,
                _ => return Ok(Some(m)),
            }
        }
    }

    /// The delivery a pull's answer carries, settled through `self`'s
    /// context.
    fn fetched(&self, answer: async_nats::Message) -> Result<Fetched, QueueError> {
        let msg = js::Message {
            message: answer,
            context: self.js.clone(),
        };
        let (delivered, seq) = match msg.info() {
            Ok(i) => (i.delivered.max(1) as u64, i.stream_sequence),
            Err(e) => return Err(backend(e)),
        };
        let msg_id = msg
            .headers
            .as_ref()
            .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
            .map(|v| v.to_string());
        let delivery = Delivery {
            subscription: self.name.clone(),
            subject: msg.subject.to_string(),
            payload: msg.payload.clone(),
            delivered,
            msg_id,
            seq,
        };
        Ok(Fetched {
            delivery,
            settle: Box::new(PullSettle {
                msg,
                js: self.js.clone(),
                name: self.name.clone(),
                timeout: self.timeout,
            }),
        })
    }
}

#[async_trait::async_trait]
impl Source for PullSource {
    async fn next(&self, wait: Duration) -> Result<Option<Fetched>, QueueError> {
        // Marked up to date before the request is sent: a reason that comes
        // after it (the request may be forgotten) ends the wait.
        let (mut every, mut own) = self.wakes.listen(&self.own);
        every.borrow_and_update();
        own.borrow_and_update();
        let wait = if wait > crate::queue::attach::FETCH_WAIT {
            let seen = Source::reasons(self);
            let pulled = self
                .pulled_at
                .swap(seen, std::sync::atomic::Ordering::SeqCst);
            wakes::pull_wait_after(wait, pulled, seen)
        } else {
            wait
        };
        let mut inbox = self.inbox().await?;
        self.request(&inbox, wait).await?;
        let answered = tokio::select! {
            r = Self::answer(&mut inbox, wait + self.timeout) => r?,
            _ = every.changed() => return Ok(None),
            _ = own.changed() => return Ok(None),
        };
        let Some(answer) = answered else {
            return Ok(None);
        };
        match answer_of(answer.status) {
            Answer::Mail => self.keep(inbox),
            Answer::Ended | Answer::NotYet => {
                self.keep(inbox);
                return Ok(None);
            }
            Answer::Refused => {
                return Err(QueueError::Backend(format!(
                    "pull for {} refused: {} {}",
                    self.name,
                    answer.status.map_or(0, |s| s.as_u16()),
                    answer.description.as_deref().unwrap_or("")
                )));
            }
        }
        self.fetched(answer).map(Some)
    }

    fn stranded_every(&self) -> Duration {
        self.wakes.stranded_every(self.level)
    }

    fn fetch_wait(&self) -> Duration {
        self.wakes.pull_wait()
    }

    fn reasons(&self) -> u64 {
        self.wakes.seen() + *self.own.borrow()
    }

    fn look_offset(&self) -> Duration {
        self.wakes.look_offset(&self.name)
    }

    async fn take_stranded(
        &self,
        judge: &dyn Handler,
        idle: Duration,
        beat: &Progress<'_>,
    ) -> Result<Option<Vec<Fetched>>, QueueError> {
        self.take_stranded_mail(judge, idle, beat).await
    }
}

pub(super) struct PullSettle {
    pub(super) msg: js::Message,
    pub(super) js: js::Context,
    pub(super) name: String,
    pub(super) timeout: Duration,
}

#[async_trait::async_trait]
impl Settle for PullSettle {
    async fn progress(&self) -> Result<(), QueueError> {
        bounded(self.timeout, self.msg.ack_with(AckKind::Progress))
            .await?
            .map_err(backend)
    }

    async fn ack(self: Box<Self>) -> Result<(), QueueError> {
        bounded(self.timeout, self.msg.double_ack())
            .await?
            .map_err(backend)
    }

    async fn nak(self: Box<Self>) -> Result<(), QueueError> {
        bounded(self.timeout, self.msg.ack_with(AckKind::Nak(None)))
            .await?
            .map_err(backend)
    }

    async fn nak_after(self: Box<Self>, delay: Duration) -> Result<(), QueueError> {
        bounded(self.timeout, self.msg.ack_with(AckKind::Nak(Some(delay))))
            .await?
            .map_err(backend)
    }

    async fn dead_letter(self: Box<Self>, reason: &DeadLetterReason) -> Result<(), QueueError> {
        let info = self.msg.info().map_err(backend)?;
        let msg_id = self
            .msg
            .headers
            .as_ref()
            .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
            .map(|v| v.to_string());
        let headers = dead_letter_headers(
            &self.name,
            self.msg.subject.as_str(),
            info.stream_sequence,
            info.delivered as u64,
            msg_id.as_deref(),
            reason,
        );
        let copied = bounded(self.timeout, async {
            self.js
                .publish_with_headers(
                    format!("crewlet.dead.{}", self.name),
                    headers,
                    self.msg.payload.clone(),
                )
                .await?
                .await
        })
        .await;
        match copied {
            Ok(Ok(_)) => bounded(self.timeout, self.msg.double_ack_with(AckKind::Term))
                .await?
                .map_err(backend),
            Ok(Err(e)) => {
                let _ = self.msg.ack_with(AckKind::Nak(None)).await;
                Err(backend(e))
            }
            Err(e) => {
                let _ = self.msg.ack_with(AckKind::Nak(None)).await;
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answered_pull_keeps_its_inbox_and_a_refused_one_drops_it() {
        assert_eq!(answer_of(None), Answer::Mail);
        assert_eq!(answer_of(Some(StatusCode::OK)), Answer::Mail);
        assert_eq!(answer_of(Some(StatusCode::TIMEOUT)), Answer::Ended);
        assert_eq!(answer_of(Some(StatusCode::NOT_FOUND)), Answer::Ended);
        assert_eq!(answer_of(Some(StatusCode::IDLE_HEARTBEAT)), Answer::NotYet);
        for refused in [409u16, 400, 503] {
            let status = StatusCode::from_u16(refused).unwrap();
            assert_eq!(answer_of(Some(status)), Answer::Refused, "{refused}");
        }
    }

    #[test]
    fn a_pull_request_goes_to_its_consumers_next_subject() {
        assert_eq!(
            next_subject("CREWLET_AGENTS", "seat-a-mail").as_str(),
            "$JS.API.CONSUMER.MSG.NEXT.CREWLET_AGENTS.seat-a-mail"
        );
    }
}
