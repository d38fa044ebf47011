//! A mailbox's dispatch loop on JetStream: its pull ([`PullSource`], one
//! message at a time, waiting as long as the queue's wakes allow) and how a
//! delivery it fetched is settled ([`PullSettle`]: acknowledged, handed
//! back, extended, dropped).

use std::time::Duration;

use async_nats::jetstream::consumer::pull;
use async_nats::jetstream::{self as js, AckKind, stream};
use futures::StreamExt;

use super::{backend, bounded, dead_letter_headers, listing, wakes};
use crate::queue::attach::{Fetched, Settle, Source};
use crate::queue::{DeadLetterReason, Delivery, Handler, QueueError};
use crate::watchdog::Progress;

pub(super) struct PullSource {
    pub(super) consumer: js::consumer::Consumer<pull::Config>,
    pub(super) stream: stream::Stream,
    pub(super) js: js::Context,
    pub(super) name: String,
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
        let mut batch = bounded(
            self.timeout,
            self.consumer
                .fetch()
                .max_messages(1)
                .expires(wait)
                .messages(),
        )
        .await?
        .map_err(backend)?;
        let msg = tokio::select! {
            r = tokio::time::timeout(wait + self.timeout, batch.next()) => match r {
                Err(_) | Ok(None) => return Ok(None),
                Ok(Some(Err(e))) => return Err(backend(e)),
                Ok(Some(Ok(m))) => m,
            },
            _ = every.changed() => return Ok(None),
            _ = own.changed() => return Ok(None),
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
        Ok(Some(Fetched {
            delivery,
            settle: Box::new(PullSettle {
                msg,
                js: self.js.clone(),
                name: self.name.clone(),
                timeout: self.timeout,
            }),
        }))
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
