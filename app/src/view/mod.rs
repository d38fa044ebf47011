//! The pages' pure view logic: how the data of [`crate::api`] reads in
//! words and folds into what a page shows. Nothing here touches the DOM or
//! the node, so every piece is tested as a plain function.

mod chart;
mod events;
mod fleet;
mod handoffs;
mod memory;
mod seats;
mod time;
mod timeline;

pub use chart::{Bar, bars, dots, inbox_words, line_points, ms_words, strip_words};
pub use events::{Severity, severity};
pub use fleet::{duration_words, presence_left, rfc3339_seconds, unfollowed};
pub use handoffs::{HANDOFFS_KEPT, HandoffState, HandoffView, apply_handoff_event};
pub use seats::{clipped, runs_summary, spend_summary, tool_servers_summary};
pub use time::{Clock, offset_label, when};
pub use timeline::{TimelineItem, timeline};
