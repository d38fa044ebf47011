//! Small reusable pieces of the dashboard.

pub mod layout;
pub mod notice;
