//! The handoffs Settings › Nodes lists: a seat offered by one node and
//! taken (or withdrawn) by another, folded from the fleet's events.

/// One handoff as Settings › Nodes shows it, built from the fleet's
/// `seat_offered`, `seat_offer_taken` and `seat_offer_withdrawn` events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandoffView {
    pub seat: String,
    /// The giver's epoch (the tenure offered).
    pub epoch: u64,
    /// The named successor, when known.
    pub to: Option<String>,
    /// The giver, when known.
    pub from: Option<String>,
    /// Why the seat was offered (`drain`, `rebalance`, `moved`, …).
    pub reason: Option<String>,
    pub state: HandoffState,
    /// RFC 3339 of the last event about it.
    pub at: String,
}

/// Where a handoff is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HandoffState {
    Offered,
    /// The successor took it (a new epoch) after `dark_ms` with no turn
    /// admitted.
    Taken {
        epoch: u64,
        dark_ms: u64,
    },
    /// The giver took its offer back and resumed; `why` says what happened.
    Withdrawn {
        why: String,
    },
}

impl HandoffView {
    /// "offered → node-b", "taken by node-b · dark 42 ms", "withdrawn (timeout)".
    pub fn status(&self) -> String {
        let to = self.to.as_deref().unwrap_or("?");
        match &self.state {
            HandoffState::Offered => format!("offered → {to}"),
            HandoffState::Taken { dark_ms, .. } => {
                format!("taken by {to} · dark {dark_ms} ms")
            }
            HandoffState::Withdrawn { why } => format!("withdrawn ({why})"),
        }
    }

    pub fn state_name(&self) -> &'static str {
        match self.state {
            HandoffState::Offered => "offered",
            HandoffState::Taken { .. } => "taken",
            HandoffState::Withdrawn { .. } => "withdrawn",
        }
    }
}

/// Handoffs the Nodes page keeps.
pub const HANDOFFS_KEPT: usize = 20;

/// Pure: fold one fleet event (its name and JSON) into `list`, newest
/// first, keeping [`HANDOFFS_KEPT`]. An offer opens a row; a take or a
/// withdrawal settles the row of that seat and epoch (or opens one, when
/// the offer came before the page was open). Other events change nothing.
pub fn apply_handoff_event(list: &mut Vec<HandoffView>, name: &str, data: &str) {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(data) else {
        return;
    };
    let text = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_string);
    let num = |k: &str| v.get(k).and_then(|x| x.as_u64());
    let Some(seat) = text("seat") else {
        return;
    };
    let at = text("at").unwrap_or_default();
    // The tenure the event is about: the offered one.
    let offered_epoch = match name {
        "seat_offered" | "seat_offer_withdrawn" => num("epoch"),
        "seat_offer_taken" => num("from_epoch"),
        _ => return,
    };
    let Some(epoch) = offered_epoch else {
        return;
    };
    let found = list.iter().position(|h| h.seat == seat && h.epoch == epoch);
    let mut row = match found {
        Some(i) => list.remove(i),
        None => HandoffView {
            seat: seat.clone(),
            epoch,
            to: None,
            from: None,
            reason: None,
            state: HandoffState::Offered,
            at: at.clone(),
        },
    };
    row.at = at;
    match name {
        "seat_offered" => {
            row.to = text("to").or(row.to);
            row.from = text("node").or(row.from);
            row.reason = v
                .get("reason")
                .map(|r| match r.as_str() {
                    Some(s) => s.to_string(),
                    None => r.to_string(),
                })
                .or(row.reason);
        }
        "seat_offer_taken" => {
            // The taker says it: it is the named successor.
            row.to = text("node").or(row.to);
            row.from = text("from").or(row.from);
            row.state = HandoffState::Taken {
                epoch: num("epoch").unwrap_or_default(),
                dark_ms: num("dark_ms").unwrap_or_default(),
            };
        }
        _ => {
            row.to = text("to").or(row.to);
            row.from = text("node").or(row.from);
            row.state = HandoffState::Withdrawn {
                why: text("why").unwrap_or_default(),
            };
        }
    }
    list.insert(0, row);
    list.truncate(HANDOFFS_KEPT);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(v: serde_json::Value) -> String {
        v.to_string()
    }

    #[test]
    fn an_offer_then_its_take_is_one_row_marked_taken_with_its_dark_time() {
        let mut list = Vec::new();
        apply_handoff_event(
            &mut list,
            "seat_offered",
            &ev(
                serde_json::json!({"event": "seat_offered", "node": "a", "at": "t1",
                "seat": "s", "epoch": 4, "to": "b", "reason": "drain"}),
            ),
        );
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].status(), "offered → b");
        assert_eq!(list[0].reason.as_deref(), Some("drain"));
        apply_handoff_event(
            &mut list,
            "seat_offer_taken",
            &ev(
                serde_json::json!({"event": "seat_offer_taken", "node": "b", "at": "t2",
                "seat": "s", "epoch": 5, "from_epoch": 4, "from": "a", "dark_ms": 37}),
            ),
        );
        assert_eq!(list.len(), 1, "{list:?}");
        assert_eq!(
            list[0].state,
            HandoffState::Taken {
                epoch: 5,
                dark_ms: 37
            }
        );
        assert_eq!(list[0].status(), "taken by b · dark 37 ms");
        assert_eq!(list[0].from.as_deref(), Some("a"));
        assert_eq!(list[0].at, "t2");
    }

    #[test]
    fn a_withdrawn_offer_says_why_and_a_take_seen_alone_still_shows() {
        let mut list = Vec::new();
        apply_handoff_event(
            &mut list,
            "seat_offered",
            &ev(serde_json::json!({"seat": "s", "epoch": 2, "to": "b", "node": "a"})),
        );
        apply_handoff_event(
            &mut list,
            "seat_offer_withdrawn",
            &ev(serde_json::json!({"seat": "s", "epoch": 2, "to": "b", "why": "timeout"})),
        );
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].status(), "withdrawn (timeout)");
        // A take whose offer came before the page opened.
        apply_handoff_event(
            &mut list,
            "seat_offer_taken",
            &ev(
                serde_json::json!({"seat": "t", "epoch": 9, "from_epoch": 8, "from": "a",
                "dark_ms": 5, "node": "c"}),
            ),
        );
        assert_eq!(list.len(), 2);
        assert_eq!(list[0].seat, "t");
        assert_eq!(list[0].status(), "taken by c · dark 5 ms");
        // Anything else changes nothing.
        apply_handoff_event(
            &mut list,
            "seat_claimed",
            &ev(serde_json::json!({"seat": "s"})),
        );
        apply_handoff_event(&mut list, "seat_offered", "not json");
        assert_eq!(list.len(), 2);
    }

    #[test]
    fn the_handoff_list_keeps_the_newest_twenty() {
        let mut list = Vec::new();
        for i in 0..30u64 {
            apply_handoff_event(
                &mut list,
                "seat_offered",
                &ev(serde_json::json!({"seat": format!("s{i}"), "epoch": 1, "to": "b"})),
            );
        }
        assert_eq!(list.len(), HANDOFFS_KEPT);
        assert_eq!(list[0].seat, "s29");
        assert_eq!(list[HANDOFFS_KEPT - 1].seat, "s10");
    }
}
