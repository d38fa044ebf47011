//! Crewlet node: the seat-ownership engine and everything one node serves.
//!
//! The `crewlet` binary (`main.rs`) is a thin edge over this library: it
//! parses the command line, loads the company file and hands it to
//! [`node::run`].

pub mod audit;
pub mod clock;
pub mod company;
pub mod config;
pub mod coord;
pub mod db;
pub mod duty;
pub mod engine;
pub mod events;
pub mod identity;
pub mod jetstream_api;
pub mod logging;
pub mod memory;
pub mod metrics;
pub mod node;
pub mod queue;
pub mod scatter;
pub mod seat;
pub mod tasks;
pub mod trends;
pub mod watchdog;
pub mod web;

/// The version of this build.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
