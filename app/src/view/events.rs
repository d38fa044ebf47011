//! How the Events page and a seat's timeline show an event: its loudness.

/// How loud an event is, for its row's colour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    Info,
    Warning,
    Error,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Error => "error",
        }
    }
}

/// Pure: how loud the event `name` is. Red: a turn that panicked, mail
/// dead-lettered, a teardown that cannot be proven, a tool server or run
/// that failed. Amber: a delivery deferred, a claim or renewal that could
/// not be settled, a seat nobody may run, a cap reached.
pub fn severity(name: &str) -> Severity {
    match name {
        "turn.guard_breach"
        | "message_dead_lettered"
        | "seat_release_unproven"
        | "seat_still_unproven"
        | "seat_undead_lost"
        | "mcp_server_failed"
        | "sandbox_run_failed"
        | "seat_mailbox_unregistered" => Severity::Error,
        "delivery_deferred"
        | "seat_renew_unknown"
        | "seat_admission_stale"
        | "seats_unplaceable"
        | "seat_claims_blocked_by_older_protocol"
        | "seat_budget_exhausted"
        | "mcp_server_exited"
        | "turn_trigger_skipped"
        | "seat_detached" => Severity::Warning,
        _ => Severity::Info,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guard_breach_is_red_a_deferral_amber_and_a_finished_turn_plain() {
        assert_eq!(severity("turn.guard_breach"), Severity::Error);
        assert_eq!(severity("message_dead_lettered"), Severity::Error);
        assert_eq!(severity("seat_release_unproven"), Severity::Error);
        assert_eq!(severity("delivery_deferred"), Severity::Warning);
        assert_eq!(severity("turn_completed"), Severity::Info);
    }

    /// An undead seat whose lease was lost reads red on the timeline: its
    /// teardown never succeeded and a peer may now claim it.
    #[test]
    fn an_undead_seat_whose_lease_was_lost_reads_red_on_the_timeline() {
        assert_eq!(severity("seat_undead_lost"), Severity::Error);
    }
}
