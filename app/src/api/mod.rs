//! The serde types the browser and the node exchange, by page.
//!
//! Everything here crosses the wire: it is plain data, with no behaviour and
//! nothing that only one side could build. The node fills these from its
//! engine; the pages render them, with the words and folds of
//! [`crate::view`] (re-exported here too).

mod audit;
mod dead_letters;
mod events;
mod fleet;
mod memory;
mod node_order;
mod people;
mod seats;
mod trends;

pub use audit::*;
pub use dead_letters::*;
pub use events::*;
pub use fleet::*;
pub use memory::*;
pub use node_order::*;
pub use people::*;
pub use seats::*;
pub use trends::*;

pub use crate::view::{
    HANDOFFS_KEPT, HandoffState, HandoffView, apply_handoff_event, duration_words, presence_left,
    rfc3339_seconds, runs_summary, unfollowed,
};
