//! Small reusable pieces of the dashboard.

pub mod audit;
pub mod chart;
pub mod layout;
pub mod notice;
pub mod pager;
pub mod time;
