//! The read-back of a publish: mail the broker acknowledged is looked for
//! in the stream, and mail it dropped is published again ([`Kept`],
//! [`judge_kept`], `JetStreamQueue::keep`).
//!
//! A NATS 2.9 stream leader can acknowledge a publish to an
//! interest-retained subject and then drop it for "no interest" (just
//! after an election, and for long stretches after a leader restart in the
//! chaos soak). A copy of mail that was answered would run it again, so a
//! message is copied at once only when it cannot have been answered: its
//! subscription did not deliver that far, or passed over it with nothing
//! acknowledged at or past it and nothing in hand. Mail gone while
//! deliveries are in hand is looked at until they may have settled, then
//! copied: a delivery in hand is still stored, so one that stays in hand
//! is another message (chaos ci profile, 2.9.10: a delivery handed back
//! with the gate closed stayed in hand, and three messages dropped behind
//! it were left as possibly delivered — lost). A copy carries the same
//! event id, so the completion ledger skips it if the original was in fact
//! answered.
//!
//! A read-back that gets no answer (the broker restarting a member, a
//! leader election) says nothing: it is looked at again, and a publish
//! whose read-back never answers fails, so its sender publishes again
//! under the same message id (the broker's deduplication makes that safe)
//! — an acknowledged publish is never taken for kept unread. What the next
//! look does is a pure decision ([`keep_step`]).

use std::time::Duration;

use bytes::Bytes;

use super::{JetStreamQueue, backend, bounded, info_not_found, raw_not_found};
use crate::queue::{Queue, QueueError, QueueEvent};

/// How many times mail the broker acknowledged but did not keep is
/// published again before the publish fails.
pub const KEEP_ATTEMPTS: usize = 5;
/// The wait before the second copy; it doubles for each later one (100,
/// 200, 400, 800 ms). Looks again after one that could not tell wait the
/// same.
pub const KEEP_BACKOFF: Duration = Duration::from_millis(100);
/// How many read-backs a publish may make that get no answer, or find the
/// mail gone while deliveries are in hand, before it settles as it can.
pub const KEEP_LOOKS: usize = 5;

/// Where a kept publish landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Published {
    /// The stream sequence the message is kept at (a copy's, when the
    /// first was dropped).
    pub seq: u64,
    /// The broker recognised the message id as one it had already.
    pub duplicate: bool,
}

/// What an acknowledged publish's read-back says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kept {
    /// The message is in the stream.
    Stored,
    /// No subscription covers the subject: discarded at the publish, as the
    /// contract says.
    Uncovered,
    /// Gone and never acknowledged: its subscription did not deliver that
    /// far, or passed over it with nothing acknowledged at or past it and
    /// nothing in hand. The broker dropped it; a copy cannot run anything
    /// twice.
    Dropped,
    /// Gone while its subscription has deliveries in hand and nothing
    /// acknowledged at or past it: it may have been answered while an
    /// earlier delivery stays in hand. Looked at again once they may have
    /// settled, then copied ([`KEEP_LOOKS`]).
    InHand,
    /// Gone while its subscription acknowledged at or past it: answered and
    /// removed (a fast handler acknowledges within the read-back), or
    /// dropped; a copy could run it twice, so none is made.
    CannotTell,
}

/// Where the subscription covering a subject stands, as its consumer info
/// says after the message was found gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Covering {
    /// The stream sequence it delivered up to. A pull subscription waiting
    /// for mail moves this past sequences it never delivered (other seats'
    /// mail, dropped mail), so it alone cannot say a message was delivered.
    pub delivered: u64,
    /// The stream sequence of its acknowledgement floor: everything it
    /// delivered up to here is acknowledged. Moved only by an
    /// acknowledgement (or a termination), never by passing over a gap.
    pub ack_floor: u64,
    /// Deliveries in hand, not yet acknowledged.
    pub ack_pending: u64,
}

/// The read-back decision (pure). `covering`: the subscription covering
/// the subject (`None`: nothing covers it), read after the message was
/// found gone. Mail answered before the read-back was delivered and
/// acknowledged: once nothing else is in hand the floor stands at or past
/// it, and while something is, nothing can be told. Mail dropped and passed
/// over leaves the floor below it (chaos ci profile, NATS 2.9: 57
/// acknowledged messages taken for answered on `delivered` alone, every
/// subscription having passed them while waiting for mail).
pub fn judge_kept(stored: bool, covering: Option<Covering>, seq: u64) -> Kept {
    match (stored, covering) {
        (true, _) => Kept::Stored,
        (false, None) => Kept::Uncovered,
        (false, Some(c)) if c.delivered < seq => Kept::Dropped,
        (false, Some(c)) if c.ack_floor < seq && c.ack_pending == 0 => Kept::Dropped,
        (false, Some(c)) if c.ack_floor < seq => Kept::InHand,
        (false, Some(_)) => Kept::CannotTell,
    }
}

/// What the read-back of a publish does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeepStep {
    /// Kept (or discarded by the contract): the publish is done.
    Done,
    /// Dropped: publish a copy.
    Copy,
    /// Look again after this long.
    LookAgain(Duration),
    /// Every copy was dropped too: the publish fails (`NotKept`).
    NotKept,
    /// No look was answered: the publish fails, and its sender publishes
    /// again under the same message id.
    Unread,
}

/// Pure: the next step of a publish's read-back, from what the last look
/// said (`None`: it got no answer), the looks made so far (the last one
/// included) and the copies published.
pub fn keep_step(look: Option<Kept>, looks: usize, copies: usize) -> KeepStep {
    let again = || KeepStep::LookAgain(KEEP_BACKOFF * (1 << (looks - 1).min(4)));
    match look {
        Some(Kept::Stored | Kept::Uncovered | Kept::CannotTell) => KeepStep::Done,
        Some(Kept::Dropped) if copies >= KEEP_ATTEMPTS => KeepStep::NotKept,
        Some(Kept::Dropped) => KeepStep::Copy,
        Some(Kept::InHand) if looks >= KEEP_LOOKS && copies >= KEEP_ATTEMPTS => KeepStep::NotKept,
        Some(Kept::InHand) if looks >= KEEP_LOOKS => KeepStep::Copy,
        None if looks >= KEEP_LOOKS => KeepStep::Unread,
        Some(Kept::InHand) | None => again(),
    }
}

/// The message id of the copy published for mail dropped at `seq`: derived
/// from the original's id (or the sequence), so a repeated look at the
/// same drop is deduplicated by the broker.
pub fn kept_copy_id(msg_id: Option<&str>, seq: u64) -> String {
    match msg_id {
        Some(id) => format!("{id}~kept@{seq}"),
        None => format!("kept@{seq}"),
    }
}

/// Where a consumer stands, for the read-back's judgement.
fn covering_of(info: &async_nats::jetstream::consumer::Info) -> Covering {
    Covering {
        delivered: info.delivered.stream_sequence,
        ack_floor: info.ack_floor.stream_sequence,
        ack_pending: info.num_ack_pending as u64,
    }
}

impl JetStreamQueue {
    /// Publish and make sure the broker kept what it acknowledged.
    ///
    /// A NATS 2.9 stream leader that does not know its consumers yet (just
    /// after an election) acknowledges a publish to an interest-retained
    /// subject and then drops it for "no interest" (docs/nats.md; the chaos
    /// soak lost five messages so). After the acknowledgement the message is
    /// read back from the leader; one that is not there while the
    /// subscription covering its subject has not delivered that far, or
    /// passed over it with nothing acknowledged and nothing in hand, is
    /// published again; one gone while deliveries are in hand, once every
    /// look found them still standing (`keep`, `judge_kept`, `keep_step`). The answer names
    /// where the mail was kept, or `NotKept` once `KEEP_ATTEMPTS` copies
    /// were all dropped.
    pub async fn publish_kept(
        &self,
        subject: &str,
        msg_id: Option<&str>,
        payload: Bytes,
    ) -> Result<Published, QueueError> {
        let ack = self
            .publish_once(subject, msg_id.unwrap_or(""), payload.clone())
            .await?;
        let seq = self.keep(subject, msg_id, payload, ack.sequence).await?;
        Ok(Published {
            seq,
            duplicate: ack.duplicate,
        })
    }

    /// Make sure the message acknowledged at `seq` on `subject` is kept,
    /// publishing it again while it is not (see `publish_kept`); returns the
    /// sequence it is kept at. Mail no subscription covers is discarded at
    /// the publish by contract and left so. A read-back that gets no answer
    /// is made again ([`keep_step`]); one that never does fails the publish
    /// with its error — the acknowledgement alone does not say the broker
    /// kept it.
    pub async fn keep(
        &self,
        subject: &str,
        msg_id: Option<&str>,
        payload: Bytes,
        mut seq: u64,
    ) -> Result<u64, QueueError> {
        let (mut looks, mut copies) = (0, 0);
        loop {
            let look = self.look(subject, seq).await;
            looks += 1;
            match keep_step(look.as_ref().ok().copied(), looks, copies) {
                KeepStep::Done => return Ok(seq),
                KeepStep::LookAgain(wait) => tokio::time::sleep(wait).await,
                KeepStep::NotKept => {
                    return Err(QueueError::NotKept {
                        subject: subject.to_string(),
                        seq,
                    });
                }
                KeepStep::Unread => {
                    let e = look
                        .err()
                        .unwrap_or(QueueError::Timeout(self.settings.timeout));
                    tracing::warn!(subject, seq, error = %e, "cannot read back an acknowledged publish: the publish fails, to be sent again under the same id");
                    return Err(e);
                }
                KeepStep::Copy => {
                    // A leader that dropped one publish may drop the next
                    // while it still does not know its consumers: later
                    // copies wait longer.
                    if copies > 0 {
                        tokio::time::sleep(KEEP_BACKOFF * (1 << (copies - 1))).await;
                    }
                    copies += 1;
                    let copy_id = kept_copy_id(msg_id, seq);
                    let ack = self
                        .publish_once(subject, &copy_id, payload.clone())
                        .await?;
                    (self.events)(QueueEvent::Republished {
                        subject: subject.to_string(),
                        seq,
                        new_seq: ack.sequence,
                    });
                    seq = ack.sequence;
                    looks = 0;
                }
            }
        }
    }

    /// One read-back of the message at `seq`: whether the stream keeps it
    /// and, when it does not, where the subscription covering `subject`
    /// stands.
    async fn look(&self, subject: &str, seq: u64) -> Result<Kept, QueueError> {
        let stored = match bounded(self.settings.timeout, self.agents.get_raw_message(seq)).await? {
            Ok(_) => true,
            Err(e) if raw_not_found(&e) => false,
            Err(e) => return Err(backend(e)),
        };
        if stored {
            return Ok(Kept::Stored);
        }
        let covering = self.covering(subject).await?;
        Ok(judge_kept(false, covering, seq))
    }

    /// Where the subscription covering `subject` stands (`None`: no
    /// subscription covers it). A seat mailbox's subscription is named by
    /// the subject's grammar; any other subject is looked up in the listing.
    async fn covering(&self, subject: &str) -> Result<Option<Covering>, QueueError> {
        if let Some((_, _, name)) = crate::queue::seat_subject(subject) {
            match bounded(self.settings.timeout, self.agents.consumer_info(&name)).await? {
                Ok(info) if crate::queue::subject_matches(&info.config.filter_subject, subject) => {
                    return Ok(Some(covering_of(&info)));
                }
                Ok(_) => {}
                Err(e) if info_not_found(&e) => {}
                Err(e) => return Err(backend(e)),
            }
        }
        let Some(name) = self
            .list_subscriptions()
            .await?
            .into_iter()
            .find(|s| crate::queue::subject_matches(&s.subject, subject))
            .map(|s| s.name)
        else {
            return Ok(None);
        };
        match bounded(self.settings.timeout, self.agents.consumer_info(&name)).await? {
            Ok(info) => Ok(Some(covering_of(&info))),
            Err(e) if info_not_found(&e) => Ok(None),
            Err(e) => Err(backend(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_mail_is_kept_and_uncovered_mail_is_the_contracts_discard() {
        let idle = Covering {
            delivered: 0,
            ack_floor: 0,
            ack_pending: 0,
        };
        assert_eq!(judge_kept(true, Some(idle), 5), Kept::Stored);
        assert_eq!(judge_kept(true, None, 5), Kept::Stored);
        assert_eq!(judge_kept(false, None, 5), Kept::Uncovered);
    }

    #[test]
    fn gone_mail_its_subscription_never_delivered_is_a_drop() {
        let c = |delivered| Covering {
            delivered,
            ack_floor: 0,
            ack_pending: 0,
        };
        assert_eq!(judge_kept(false, Some(c(4)), 5), Kept::Dropped);
        assert_eq!(judge_kept(false, Some(c(0)), 5), Kept::Dropped);
    }

    #[test]
    fn gone_mail_its_subscription_passed_over_with_nothing_acknowledged_or_in_hand_is_a_drop() {
        let passed = Covering {
            delivered: 9,
            ack_floor: 4,
            ack_pending: 0,
        };
        assert_eq!(judge_kept(false, Some(passed), 5), Kept::Dropped);
    }

    #[test]
    fn gone_mail_acknowledged_past_is_never_copied_nor_mail_gone_with_deliveries_in_hand_before_every_look()
     {
        let acked_past = Covering {
            delivered: 9,
            ack_floor: 5,
            ack_pending: 0,
        };
        let in_hand = Covering {
            delivered: 9,
            ack_floor: 4,
            ack_pending: 1,
        };
        assert_eq!(judge_kept(false, Some(acked_past), 5), Kept::CannotTell);
        assert_eq!(judge_kept(false, Some(in_hand), 5), Kept::InHand);
        for looks in 1..=KEEP_LOOKS {
            assert_eq!(keep_step(Some(Kept::CannotTell), looks, 0), KeepStep::Done);
        }
        for looks in 1..KEEP_LOOKS {
            assert_ne!(keep_step(Some(Kept::InHand), looks, 0), KeepStep::Copy);
        }
    }

    /// Chaos seed 5004 lost an acknowledged message with no fetch, no turn
    /// and no dead letter, published during a NATS follower restart; a
    /// read-back that failed was then taken for kept, silently.
    #[test]
    fn a_read_back_that_gets_no_answer_is_made_again_and_never_taken_for_kept() {
        for looks in 1..KEEP_LOOKS {
            assert!(
                matches!(keep_step(None, looks, 0), KeepStep::LookAgain(_)),
                "look {looks}"
            );
        }
        assert_eq!(keep_step(None, KEEP_LOOKS, 0), KeepStep::Unread);
        // An answer after unanswered looks decides as any answer does.
        assert_eq!(keep_step(Some(Kept::Dropped), 3, 0), KeepStep::Copy);
        assert_eq!(keep_step(Some(Kept::Stored), 3, 0), KeepStep::Done);
    }

    /// Chaos ci profile, 2.9.10: seat-37's consumer kept a delivery in hand
    /// (handed back while the gate was closed, never handed out again) and
    /// three acknowledged messages the leader dropped behind it were left
    /// as possibly delivered; none was ever answered.
    #[test]
    fn mail_gone_with_deliveries_in_hand_is_looked_at_again_then_copied_until_the_copies_run_out() {
        let waits: Vec<KeepStep> = (1..KEEP_LOOKS)
            .map(|looks| keep_step(Some(Kept::InHand), looks, 0))
            .collect();
        assert_eq!(
            waits,
            [100, 200, 400, 800].map(|ms| KeepStep::LookAgain(Duration::from_millis(ms)))
        );
        assert_eq!(keep_step(Some(Kept::InHand), KEEP_LOOKS, 0), KeepStep::Copy);
        assert_eq!(
            keep_step(Some(Kept::InHand), KEEP_LOOKS, KEEP_ATTEMPTS - 1),
            KeepStep::Copy
        );
        assert_eq!(
            keep_step(Some(Kept::InHand), KEEP_LOOKS, KEEP_ATTEMPTS),
            KeepStep::NotKept
        );
    }

    #[test]
    fn dropped_mail_is_copied_until_the_copies_run_out() {
        assert_eq!(keep_step(Some(Kept::Dropped), 1, 0), KeepStep::Copy);
        assert_eq!(
            keep_step(Some(Kept::Dropped), 1, KEEP_ATTEMPTS - 1),
            KeepStep::Copy
        );
        assert_eq!(
            keep_step(Some(Kept::Dropped), 1, KEEP_ATTEMPTS),
            KeepStep::NotKept
        );
        assert_eq!(keep_step(Some(Kept::Uncovered), 1, 2), KeepStep::Done);
    }

    #[test]
    fn a_copy_of_the_same_drop_has_the_same_id() {
        assert_eq!(kept_copy_id(Some("m-1"), 7), "m-1~kept@7");
        assert_eq!(kept_copy_id(Some("m-1"), 7), kept_copy_id(Some("m-1"), 7));
        assert_eq!(kept_copy_id(None, 7), "kept@7");
    }
}
