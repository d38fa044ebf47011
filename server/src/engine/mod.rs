//! The turn engine: what reaches a seat's inbox ([`envelope`]), what runs a
//! turn ([`agent`]) and the completion ledger that keeps a finished trigger
//! from running twice ([`ledger`]).

pub mod agent;
pub mod approvals;
pub mod children;
pub mod command;
pub mod echo;
pub mod envelope;
pub mod ledger;
pub mod mcp;
pub mod outbox;
pub mod partition;
pub mod pause;
pub mod routing;
pub mod runs;
pub mod runtime;
pub mod tools;
pub mod turn;
