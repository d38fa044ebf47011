//! The turn engine: what reaches a seat's inbox ([`envelope`]) and the
//! completion ledger that keeps a finished trigger from running twice
//! ([`ledger`]). Agents and dispatch build on these.

pub mod envelope;
pub mod ledger;
