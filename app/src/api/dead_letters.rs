//! Dead letters: mail the queue gave up on, as the Dead letters page, a
//! seat's page and `GET /api/dead-letters` show it.

use serde::{Deserialize, Serialize};

/// One dead letter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetterView {
    /// Its own number: what re-publishing or discarding names.
    pub id: u64,
    /// The seat whose inbox it was sent to (none for other subjects).
    pub seat: Option<String>,
    pub subscription: String,
    pub subject: String,
    /// How often it was delivered before the queue gave up.
    pub delivered: u64,
    pub msg_id: Option<String>,
    /// Why the queue gave up on it.
    pub reason: String,
    /// The mail as text (its first [`DEAD_LETTER_PREVIEW_CHARS`]
    /// characters).
    pub payload: String,
    /// Whether `payload` was cut.
    pub truncated: bool,
    /// RFC 3339: when it was dead-lettered.
    pub at: String,
}

/// How much of a dead letter's mail a page shows.
pub const DEAD_LETTER_PREVIEW_CHARS: usize = 4_000;

/// The newest dead letters and how many are kept in all.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetterList {
    pub letters: Vec<DeadLetterView>,
    /// Every dead letter kept (the fleet's, not only those listed).
    pub total: u64,
}

/// What a person did to a dead letter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetterActionResult {
    pub id: u64,
    /// The sentence the page shows ("re-published to seat … as …",
    /// "discarded").
    pub result: String,
}
