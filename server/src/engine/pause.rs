//! A person's pause, resume and stop of a seat.
//!
//! A pause is a fleet-wide record in `crewlet_pauses` under the seat's
//! handle (who, when, why, and whether the running turn should stop). The
//! seat's holder takes the named hold [`PAUSE_HOLD`] on its inbox; a node
//! that acquires a paused seat reads the record in the acquire hook and
//! attaches the inbox with the hold already taken, so no delivery reaches
//! a new holder before a resume. Resume deletes the record and the hold
//! is dropped. The holder learns of a change from a nudge on the seat's
//! owner-routed control subject (`crewlet.agent.{handle}.control`), which
//! waits there for the next holder when nobody holds the seat; the record,
//! not the nudge, is the truth. A stop travels the same way and closes the
//! running turn at its next round boundary.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::coord::{KvError, StateBucket, Store, StoreError};
use crate::queue::{Queue, QueueError, control_subject};

/// The named hold a pause takes on a seat's inbox.
pub const PAUSE_HOLD: &str = "pause";

/// A pause, as kept in `crewlet_pauses`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PauseRecord {
    pub by: String,
    /// RFC 3339.
    pub at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default)]
    pub stop_running_turn: bool,
}

/// The seat's control-subject message lives beside the runs that use it
/// most (a pause, a stop and a run's completion share the subject).
pub use super::runs::ControlMessage;

#[derive(Debug, thiserror::Error)]
pub enum PauseError {
    #[error("no seat {0:?} in the company")]
    NoSuchSeat(String),
    #[error("the coordination store: {0}")]
    Store(String),
    #[error("the seat's control subject: {0}")]
    Queue(#[from] QueueError),
}

impl From<StoreError> for PauseError {
    fn from(e: StoreError) -> Self {
        PauseError::Store(e.to_string())
    }
}

impl From<KvError> for PauseError {
    fn from(e: KvError) -> Self {
        PauseError::Store(e.to_string())
    }
}

/// The seat's pause, if any.
pub async fn read(store: &dyn Store, handle: &str) -> Result<Option<PauseRecord>, StoreError> {
    Ok(store
        .get(StateBucket::Pauses, handle)
        .await?
        .map(|e| match serde_json::from_slice(&e.value) {
            Ok(r) => r,
            Err(err) => {
                // A record nobody can read still says "paused": holding
                // mail is the safe reading of an unreadable pause.
                tracing::warn!(seat = handle, error = %err, "an unreadable pause record; treating the seat as paused");
                PauseRecord {
                    by: "unknown".into(),
                    at: String::new(),
                    reason: Some("unreadable pause record".into()),
                    stop_running_turn: false,
                }
            }
        }))
}

async fn nudge(queue: &dyn Queue, handle: &str, m: &ControlMessage) -> Result<(), QueueError> {
    let body = serde_json::to_vec(m).unwrap_or_default();
    queue
        .publish(&control_subject(handle), None, Bytes::from(body))
        .await
        .map(|_| ())
}

/// Pause `handle` (or update its pause). Returns false when it was paused
/// already (the record is updated all the same).
pub async fn pause(
    store: &dyn Store,
    queue: &dyn Queue,
    handle: &str,
    record: PauseRecord,
) -> Result<bool, PauseError> {
    let value = Bytes::from(serde_json::to_vec(&record).unwrap_or_default());
    let mut fresh = true;
    for _ in 0..5 {
        match store.get(StateBucket::Pauses, handle).await? {
            None => match store
                .create(StateBucket::Pauses, handle, value.clone())
                .await
            {
                Ok(_) => break,
                Err(KvError::AlreadyExists) => continue,
                Err(e) => return Err(e.into()),
            },
            Some(e) => {
                fresh = false;
                match store
                    .update(StateBucket::Pauses, handle, value.clone(), e.revision)
                    .await
                {
                    Ok(_) => break,
                    Err(KvError::WrongRevision) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    nudge(queue, handle, &ControlMessage::PauseChanged).await?;
    if record.stop_running_turn {
        nudge(
            queue,
            handle,
            &ControlMessage::Stop {
                by: record.by.clone(),
                at: record.at.clone(),
            },
        )
        .await?;
    }
    Ok(fresh)
}

/// Resume `handle`. Returns false when it was not paused.
pub async fn resume(
    store: &dyn Store,
    queue: &dyn Queue,
    handle: &str,
) -> Result<bool, PauseError> {
    let mut was = false;
    for _ in 0..5 {
        match store.get(StateBucket::Pauses, handle).await? {
            None => break,
            Some(e) => match store.delete(StateBucket::Pauses, handle, e.revision).await {
                Ok(()) => {
                    was = true;
                    break;
                }
                Err(KvError::WrongRevision) => continue,
                Err(e) => return Err(e.into()),
            },
        }
    }
    nudge(queue, handle, &ControlMessage::PauseChanged).await?;
    Ok(was)
}

/// Ask the seat's holder to stop the running turn at its next round.
pub async fn stop(queue: &dyn Queue, handle: &str, by: &str) -> Result<(), PauseError> {
    nudge(
        queue,
        handle,
        &ControlMessage::Stop {
            by: by.to_string(),
            at: crate::clock::now_rfc3339(),
        },
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_messages_have_a_stable_wire_form() {
        assert_eq!(
            serde_json::to_string(&ControlMessage::PauseChanged).unwrap(),
            r#"{"type":"pause_changed"}"#
        );
        let stop: ControlMessage =
            serde_json::from_str(r#"{"type":"stop","by":"ann","at":"2026-11-30T08:00:00Z"}"#)
                .unwrap();
        assert_eq!(
            stop,
            ControlMessage::Stop {
                by: "ann".into(),
                at: "2026-11-30T08:00:00Z".into()
            }
        );
    }
}
