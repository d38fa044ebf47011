//! One module per dashboard page.

pub mod audit;
pub mod events;
pub mod login;
pub mod memory;
pub mod node_order;
pub mod nodes;
pub mod people;
pub mod seats;
