//! Small reusable pieces of the dashboard.

pub mod audit;
pub mod layout;
pub mod notice;
pub mod pager;
pub mod time;
