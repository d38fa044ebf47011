//! The Seats page's words for a row.

use crate::api::SeatRunView;

/// The Seats row's line about a seat's detached runs: "1 run: running on
/// node-a", "2 runs: running on node-a, finished on node-b"; `None` when
/// it has none.
pub fn runs_summary(runs: &[SeatRunView]) -> Option<String> {
    if runs.is_empty() {
        return None;
    }
    let each: Vec<String> = runs
        .iter()
        .map(|r| format!("{} on {}", r.state, r.launcher_node))
        .collect();
    let n = runs.len();
    Some(format!(
        "{n} run{}: {}",
        if n == 1 { "" } else { "s" },
        each.join(", ")
    ))
}
