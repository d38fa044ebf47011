//! Dead letters as people see and handle them: the view of one
//! ([`view_of`]), the list a page or `GET /api/dead-letters` reads, and
//! the two things an operator may do to one — publish it again to its
//! seat's inbox, or discard it — each audited, refused or not.

use app::api::{DEAD_LETTER_PREVIEW_CHARS, DeadLetterActionResult, DeadLetterList, DeadLetterView};
use app::console::ConsoleError;

use crate::queue::{DeadLetter, Queue, inbox_seat, requeue_dead_letter};

/// At most this many dead letters are read for one list.
pub const DEAD_LETTERS_LISTED: usize = 1_000;

/// Pure: a dead letter as a page shows it (its mail cut to
/// [`DEAD_LETTER_PREVIEW_CHARS`] characters).
pub fn view_of(d: DeadLetter) -> DeadLetterView {
    let text = String::from_utf8_lossy(&d.payload);
    let truncated = text.chars().count() > DEAD_LETTER_PREVIEW_CHARS;
    let payload = text.chars().take(DEAD_LETTER_PREVIEW_CHARS).collect();
    DeadLetterView {
        id: d.id,
        seat: inbox_seat(&d.subject).map(str::to_string),
        subscription: d.subscription,
        subject: d.subject,
        delivered: d.delivered,
        msg_id: d.msg_id,
        reason: d.reason,
        payload,
        truncated,
        at: d.at,
    }
}

/// The newest `limit` dead letters (only `seat`'s, when given), and how
/// many are kept.
pub async fn list(
    queue: &dyn Queue,
    seat: Option<&str>,
    limit: usize,
) -> Result<DeadLetterList, ConsoleError> {
    let limit = limit.min(DEAD_LETTERS_LISTED);
    // A seat's own are found among the newest the node lists.
    let read = if seat.is_some() {
        DEAD_LETTERS_LISTED
    } else {
        limit
    };
    let (letters, total) = futures::join!(queue.dead_letters(read), queue.dead_letter_count());
    let letters =
        letters.map_err(|e| super::unavailable::unavailable("read the dead letters", e))?;
    let total = total.map_err(|e| super::unavailable::unavailable("count the dead letters", e))?;
    Ok(DeadLetterList {
        letters: letters
            .into_iter()
            .map(view_of)
            .filter(|v| seat.is_none() || v.seat.as_deref() == seat)
            .take(limit)
            .collect(),
        total,
    })
}

/// Which of the two an operator asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeadLetterAction {
    Requeue,
    Discard,
}

impl DeadLetterAction {
    /// The audit log's name for it.
    pub fn audit_name(self) -> &'static str {
        match self {
            DeadLetterAction::Requeue => "dead_letter.requeue",
            DeadLetterAction::Discard => "dead_letter.discard",
        }
    }

    pub fn verb(self) -> &'static str {
        match self {
            DeadLetterAction::Requeue => "re-publish a dead letter",
            DeadLetterAction::Discard => "discard a dead letter",
        }
    }
}

/// What doing `action` to dead letter `id` came to: the audit row's seat
/// and result, and the answer for the person.
pub struct Done {
    pub seat: Option<String>,
    pub audit_result: String,
    pub answer: Result<DeadLetterActionResult, ConsoleError>,
}

/// Do `action` to dead letter `id` (the person was admitted already).
pub async fn act(queue: &dyn Queue, action: DeadLetterAction, id: u64) -> Done {
    let found = match queue.find_dead_letter(id).await {
        Ok(found) => found,
        Err(e) => return failed(None, "read the dead letter", e),
    };
    let Some(dead) = found else {
        return Done {
            seat: None,
            audit_result: "refused: no such dead letter".into(),
            answer: Err(gone(id)),
        };
    };
    let seat = inbox_seat(&dead.subject).map(str::to_string);
    match action {
        DeadLetterAction::Requeue => match requeue_dead_letter(queue, id).await {
            Ok(Some(r)) => {
                let to = match &seat {
                    Some(s) => format!("seat {s}'s inbox"),
                    None => r.subject.clone(),
                };
                let result = if r.published {
                    format!("re-published to {to} as {}", r.msg_id)
                } else {
                    format!("already re-published to {to} as {}", r.msg_id)
                };
                Done {
                    seat,
                    audit_result: format!("ok: {result}"),
                    answer: Ok(DeadLetterActionResult { id, result }),
                }
            }
            Ok(None) => Done {
                seat,
                audit_result: "refused: no such dead letter".into(),
                answer: Err(gone(id)),
            },
            Err(e) => failed(seat, "re-publish the dead letter", e),
        },
        DeadLetterAction::Discard => match queue.discard_dead_letter(id).await {
            Ok(true) => Done {
                seat,
                audit_result: "ok: discarded".into(),
                answer: Ok(DeadLetterActionResult {
                    id,
                    result: "discarded".into(),
                }),
            },
            Ok(false) => Done {
                seat,
                audit_result: "refused: no such dead letter".into(),
                answer: Err(gone(id)),
            },
            Err(e) => failed(seat, "discard the dead letter", e),
        },
    }
}

fn gone(id: u64) -> ConsoleError {
    ConsoleError::NotFound(format!(
        "dead letter {id} is not there: it was re-published or discarded already, or aged out. Reload the list."
    ))
}

fn failed(seat: Option<String>, what: &str, e: impl std::fmt::Display) -> Done {
    Done {
        seat,
        audit_result: "failed: the queue is unavailable".into(),
        answer: Err(super::unavailable::unavailable(what, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_letter_is_shown_with_its_seat_and_its_mail_cut_to_the_preview() {
        let long = "x".repeat(DEAD_LETTER_PREVIEW_CHARS + 1);
        let v = view_of(DeadLetter {
            id: 3,
            subscription: "agent-ops".into(),
            subject: crate::queue::inbox_subject("ops"),
            seq: 9,
            delivered: 26,
            msg_id: Some("evt-1".into()),
            reason: "delivered 25 times without success".into(),
            payload: bytes::Bytes::from(long),
            at: "2026-12-01T10:00:00Z".into(),
        });
        assert_eq!(v.seat.as_deref(), Some("ops"));
        assert!(v.truncated);
        assert_eq!(v.payload.chars().count(), DEAD_LETTER_PREVIEW_CHARS);
        assert_eq!(v.id, 3);
    }
}
