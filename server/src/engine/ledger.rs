//! The completion ledger (spec § The completion ledger): what finished,
//! read before the next turn starts, in the fleet's coordination store
//! (`crewlet_ledger`, seven-day age) so a redelivery that lands on a peer
//! finds it.
//!
//! It is deliberately not a claim: no in-progress state, no expiry rule
//! beyond the bucket's age. It is keyed on the constituent event ids of a
//! partition, never on a coalesced digest, so a partial overlap (A+B ran;
//! A+B+C arrives) runs only C; and on the chat message ids a turn answered
//! in its thread, so that message's redelivery is a skip. Only the
//! ledgered trigger types are consulted and recorded. Both directions fail
//! open: an unreadable ledger runs the turn, an unwritable one is logged.
//!
//! [`screen`] and [`work_key`] are pure; [`read`] and [`record`] are the
//! store edges.

use std::collections::BTreeSet;
use std::time::Duration;

use bytes::Bytes;
use sha2::{Digest, Sha256};

use super::envelope::Envelope;
use crate::coord::{KvError, StateBucket, Store};

/// A store key part for an id: the id itself when it is short and plain,
/// else a digest of it (keys are `:`-separated).
fn part(id: &str) -> String {
    let plain = !id.is_empty()
        && id.len() <= 200
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if plain {
        id.to_string()
    } else {
        format!("h-{}", hex::encode(Sha256::digest(id.as_bytes())))
    }
}

/// `done:{handle}:{event id}`: the trigger finished.
pub fn done_key(handle: &str, event_id: &str) -> String {
    format!("done:{handle}:{}", part(event_id))
}

/// `answered:{handle}:{message id}`: a turn answered this chat message in
/// its thread.
pub fn answered_key(handle: &str, message_id: &str) -> String {
    format!("answered:{handle}:{}", part(message_id))
}

/// The work key of a partition: derived from its ledgered constituent event
/// ids, so it is the same on every re-run of the same work. `None` for a
/// partition with no ledgered trigger (it is never deduplicated).
pub fn work_key(triggers: &[Envelope]) -> Option<String> {
    let ids: BTreeSet<&str> = triggers
        .iter()
        .filter(|t| t.is_ledgered())
        .map(|t| t.id.as_str())
        .collect();
    if ids.is_empty() {
        return None;
    }
    let mut h = Sha256::new();
    for id in ids {
        h.update(id.as_bytes());
        h.update([0u8]);
    }
    Some(hex::encode(h.finalize()))
}

/// Why a trigger is not run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SkipReason {
    /// Its event id is recorded: the work was done (perhaps on a node that
    /// has since died).
    AlreadyDone,
    /// A later turn answered this chat message in its thread.
    AnsweredInThread,
}

/// What [`screen`] decided for one partition.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Screened {
    /// Ledgered triggers to run.
    pub run: Vec<Envelope>,
    /// Ledgered triggers the ledger says are finished.
    pub skipped: Vec<(Envelope, SkipReason)>,
    /// Triggers of a type that runs no turn: logged and acked.
    pub ignored: Vec<Envelope>,
}

/// Pure: split a partition by what the ledger holds.
pub fn screen(
    partition: &[Envelope],
    done: &BTreeSet<String>,
    answered: &BTreeSet<String>,
) -> Screened {
    let mut out = Screened::default();
    for t in partition {
        if !t.is_ledgered() {
            out.ignored.push(t.clone());
        } else if done.contains(&t.id) {
            out.skipped.push((t.clone(), SkipReason::AlreadyDone));
        } else if t.message_id.as_ref().is_some_and(|m| answered.contains(m)) {
            out.skipped.push((t.clone(), SkipReason::AnsweredInThread));
        } else {
            out.run.push(t.clone());
        }
    }
    out
}

/// What the ledger holds for a partition's ledgered triggers: the event ids
/// recorded done and the message ids recorded answered. Fails open: a read
/// that errors counts as "nothing recorded" (and is reported as `false`).
pub async fn read(
    store: &dyn Store,
    handle: &str,
    partition: &[Envelope],
) -> (BTreeSet<String>, BTreeSet<String>, bool) {
    let mut done = BTreeSet::new();
    let mut answered = BTreeSet::new();
    for t in partition.iter().filter(|t| t.is_ledgered()) {
        match store
            .get(StateBucket::Ledger, &done_key(handle, &t.id))
            .await
        {
            Ok(Some(_)) => {
                done.insert(t.id.clone());
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(seat = handle, error = %e, "the completion ledger cannot be read; running the turn (fail open)");
                return (BTreeSet::new(), BTreeSet::new(), false);
            }
        }
        if let Some(m) = &t.message_id {
            match store
                .get(StateBucket::Ledger, &answered_key(handle, m))
                .await
            {
                Ok(Some(_)) => {
                    answered.insert(m.clone());
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(seat = handle, error = %e, "the completion ledger cannot be read; running the turn (fail open)");
                    return (BTreeSet::new(), BTreeSet::new(), false);
                }
            }
        }
    }
    (done, answered, true)
}

/// Record a finished turn: its ledgered constituent event ids, and the chat
/// message ids it answered in its thread. After the effects shipped, so a
/// failure to record cannot un-ship them: it is logged (fail open). Returns
/// how many records were written (an existing record counts as written).
pub async fn record(
    store: &dyn Store,
    handle: &str,
    ran: &[Envelope],
    answered_messages: &[String],
    turn_id: &str,
) -> usize {
    record_within(
        store,
        handle,
        ran,
        answered_messages,
        turn_id,
        Duration::ZERO,
    )
    .await
}

/// [`record`], trying each key the store did not take again (every half
/// second at most) for as long as `within` lasts — the delivery's ack
/// window. A record lost to a store that stopped answering (a leader
/// election, say), with the acknowledgement lost beside it, let the
/// redelivery run the work a second time; until the ack window closes no
/// redelivery can come, so the record has that long to land. A create
/// whose answer was lost is harmless to repeat: the record then exists.
pub async fn record_within(
    store: &dyn Store,
    handle: &str,
    ran: &[Envelope],
    answered_messages: &[String],
    turn_id: &str,
    within: Duration,
) -> usize {
    let deadline = tokio::time::Instant::now() + within;
    let body = Bytes::from(
        serde_json::to_vec(&serde_json::json!({
            "turn_id": turn_id,
            "at": crate::clock::now_rfc3339(),
        }))
        .unwrap_or_default(),
    );
    let keys = ran
        .iter()
        .filter(|t| t.is_ledgered())
        .map(|t| done_key(handle, &t.id))
        .chain(answered_messages.iter().map(|m| answered_key(handle, m)));
    let mut written = 0;
    for key in keys {
        let mut pause = Duration::from_millis(100);
        loop {
            match store.create(StateBucket::Ledger, &key, body.clone()).await {
                Ok(_) | Err(KvError::AlreadyExists) => {
                    written += 1;
                    break;
                }
                Err(e) if tokio::time::Instant::now() + pause < deadline => {
                    tracing::debug!(seat = handle, key, error = %e, "cannot record a completion yet; trying again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
                Err(e) => {
                    tracing::warn!(seat = handle, key, error = %e, "cannot record a completion (fail open)");
                    break;
                }
            }
        }
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(id: &str, kind: &str) -> Envelope {
        Envelope {
            id: id.into(),
            kind: kind.into(),
            body: serde_json::Value::Null,
            thread: None,
            message_id: None,
            from: None,
            sent_at: None,
        }
    }

    fn ids(v: &[Envelope]) -> Vec<&str> {
        v.iter().map(|e| e.id.as_str()).collect()
    }

    #[test]
    fn a_partial_overlap_runs_only_the_new_trigger() {
        let p = [
            t("A", "task_assigned"),
            t("B", "task_assigned"),
            t("C", "a2a_message"),
        ];
        let done: BTreeSet<String> = ["A", "B"].iter().map(|s| s.to_string()).collect();
        let s = screen(&p, &done, &BTreeSet::new());
        assert_eq!(ids(&s.run), ["C"]);
        assert_eq!(s.skipped.len(), 2);
        assert!(s.skipped.iter().all(|(_, r)| *r == SkipReason::AlreadyDone));
    }

    #[test]
    fn a_message_answered_in_its_thread_is_skipped() {
        let mut waiting = t("M1", "external_notification");
        waiting.message_id = Some("chat-42".into());
        let answered: BTreeSet<String> = ["chat-42".to_string()].into();
        let s = screen(&[waiting], &BTreeSet::new(), &answered);
        assert!(s.run.is_empty());
        assert_eq!(s.skipped[0].1, SkipReason::AnsweredInThread);
    }

    #[test]
    fn types_that_run_no_turn_are_never_consulted() {
        let done: BTreeSet<String> = ["X".to_string()].into();
        let s = screen(&[t("X", "observability")], &done, &BTreeSet::new());
        assert_eq!(ids(&s.ignored), ["X"]);
        assert!(s.run.is_empty() && s.skipped.is_empty());
    }

    #[test]
    fn the_work_key_comes_from_constituents_not_from_a_coalesced_digest() {
        let a = [t("A", "task_assigned"), t("B", "a2a_request")];
        let b = [
            t("B", "a2a_request"),
            t("A", "task_assigned"),
            t("obs", "observability"),
        ];
        assert_eq!(
            work_key(&a),
            work_key(&b),
            "order and non-ledgered types do not matter"
        );
        assert_ne!(work_key(&a), work_key(&a[..1]));
        assert_eq!(
            work_key(&[t("obs", "observability")]),
            None,
            "an unkeyed turn is never deduped"
        );
    }

    #[test]
    fn ids_that_are_not_plain_become_digests_in_keys() {
        assert_eq!(done_key("s", "evt-1"), "done:s:evt-1");
        let k = done_key("s", "a:b/c");
        assert!(
            k.starts_with("done:s:h-") && !k["done:s:".len()..].contains(':'),
            "{k}"
        );
        assert_eq!(k, done_key("s", "a:b/c"));
    }
}
