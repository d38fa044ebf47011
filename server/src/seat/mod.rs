//! Seats: where they go ([`placement`]) and what holding one means on this
//! node (the seat host, the sweep).

pub mod engine;
pub mod host;
pub mod moves;
pub mod pace;
pub mod pass;
pub mod placement;
pub mod ranking;
