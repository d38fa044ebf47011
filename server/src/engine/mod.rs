//! The turn engine: what reaches a seat's inbox ([`envelope`]), what runs a
//! turn ([`agent`]) and the completion ledger that keeps a finished trigger
//! from running twice ([`ledger`]).

pub mod agent;
pub mod command;
pub mod envelope;
pub mod ledger;
