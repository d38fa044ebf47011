//! The Seats page's words for a row.

use crate::api::{SeatRunView, SeatSpendView, ToolServerView};

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

/// The Seats row's line about a seat's tool servers: "tools: fs running
/// (14), time on node-b"; `None` when its role has none.
pub fn tool_servers_summary(servers: &[ToolServerView]) -> Option<String> {
    if servers.is_empty() {
        return None;
    }
    let each: Vec<String> = servers
        .iter()
        .map(|s| match s.tools {
            Some(n) => format!("{} {} ({n})", s.name, s.state),
            None => format!("{} {}", s.name, s.state),
        })
        .collect();
    Some(format!("tools: {}", each.join(", ")))
}

/// The Seats row's line about a model seat's spend: "tokens: 120 / 100
/// today, 120 this week, 120 / 5000 this month".
pub fn spend_summary(s: &SeatSpendView) -> String {
    let names = ["today", "this week", "this month"];
    let each: Vec<String> = s
        .windows
        .iter()
        .zip(names)
        .map(|((_, spent, cap), name)| match cap {
            Some(c) => format!("{spent} / {c} {name}"),
            None => format!("{spent} {name}"),
        })
        .collect();
    format!(
        "tokens: {}{}",
        each.join(", "),
        if s.held {
            " — held: a cap is reached"
        } else {
            ""
        }
    )
}

/// At most `max` characters of `text`, cut with an ellipsis.
pub fn clipped(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(name: &str, state: &str, tools: Option<usize>) -> ToolServerView {
        ToolServerView {
            name: name.into(),
            transport: "stdio".into(),
            state: state.into(),
            tools,
        }
    }

    #[test]
    fn a_rows_tool_servers_read_with_their_state_and_tool_count_where_known() {
        assert_eq!(tool_servers_summary(&[]), None);
        assert_eq!(
            tool_servers_summary(&[
                server("fs", "running", Some(14)),
                server("time", "on node-b", None)
            ])
            .as_deref(),
            Some("tools: fs running (14), time on node-b")
        );
    }

    #[test]
    fn a_model_seats_spend_reads_against_the_caps_it_has() {
        let s = SeatSpendView {
            windows: vec![
                ("2026-12-01".into(), 120, Some(100)),
                ("2026-W49".into(), 120, None),
                ("2026-12".into(), 120, Some(5000)),
            ],
            held: true,
        };
        assert_eq!(
            spend_summary(&s),
            "tokens: 120 / 100 today, 120 this week, 120 / 5000 this month — held: a cap is reached"
        );
    }

    #[test]
    fn long_arguments_are_clipped_on_a_character_boundary() {
        assert_eq!(clipped("abc", 5), "abc");
        assert_eq!(clipped("ééééé", 2), "éé…");
    }
}
