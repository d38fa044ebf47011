//! The integration tests, one crate (one binary to build and link): each
//! module is a suite named for what it checks, and `support` holds the
//! fixtures every suite shares — real servers on free loopback ports, the
//! `both!` macro that runs a suite on the twin and on a real `nats-server`,
//! and waiting on a condition with a deadline. Two suites are binaries of
//! their own that borrow `support`: the chaos harness (`server/tests/
//! chaos.rs`) and `server/tests/monitoring.rs` (the metrics recorder is one
//! per process, so its nodes must be the only ones in theirs).
//!
//! Run one suite with `cargo test -p server --test it SUITE::` (for example
//! `architecture::`); docs/testing.md lists them.

#[macro_use]
mod support;

mod architecture;
mod audit_fleet;
mod cli;
mod command_agent;
mod coord_contract;
mod documented;
mod duties;
mod fleet;
mod fleet_nodes;
mod history;
mod http;
mod ledger;
mod mcp;
mod memory;
mod memory_replay;
mod memread;
mod migrations;
mod model;
mod model_real;
mod outbox;
mod queue_contract;
mod ranking;
mod ranking_http;
mod reliability;
mod runs;
mod security;
mod turns;
mod turns_tools;
mod watchdog;
