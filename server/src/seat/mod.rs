//! Seats: where they go ([`placement`]) and what holding one means on this
//! node (the seat host, the sweep).

pub mod host;
pub mod moves;
pub mod pass;
pub mod placement;
pub mod ranking;
pub mod sweep;
