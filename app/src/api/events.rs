//! The Events page and a seat's timeline: the fleet's events as the node
//! kept them, and the query that pages through them.

use serde::{Deserialize, Serialize};

/// One kept event: its number on the node's stream, its name, and the
/// event as JSON (the object `GET /api/events` sends as `data`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptEvent {
    pub id: u64,
    pub name: String,
    pub data: String,
}

/// What a page asks of the kept events: newest first, older than
/// `before` (an event id) when given, of one seat, node, turn or type.
/// Per-pass events (`seat_sweep`, `seat_claims_withheld`) are left out
/// unless `noise` or the type asks for them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventQuery {
    pub before: Option<u64>,
    pub seat: String,
    pub node: String,
    pub turn: String,
    /// An event name (`turn_completed`), or empty for any.
    pub kind: String,
    pub noise: bool,
    /// How many (at most [`EVENT_PAGE_MAX`]; 0 means [`EVENT_PAGE`]).
    pub limit: u32,
}

/// One page of kept events, newest first.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventPage {
    pub events: Vec<KeptEvent>,
    /// Older events matching the query are kept (ask with `before` set to
    /// the last id of this page).
    pub more: bool,
    /// The node's newest event id when it was read: a page that follows
    /// the live stream asks for what came after it.
    pub newest: u64,
}

/// Events on one page unless asked otherwise.
pub const EVENT_PAGE: u32 = 100;
/// The most one read returns.
pub const EVENT_PAGE_MAX: u32 = 500;

/// Events that say a periodic pass happened, hidden unless asked for.
pub const NOISE: &[&str] = &["seat_sweep", "seat_claims_withheld"];
