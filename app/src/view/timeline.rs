//! A seat's timeline: its kept events and people's actions on it, folded
//! into the lines a person reads — a turn from its start to its end (how
//! long, how it ended, what it spent), a pause and who made it, a move,
//! an error — newest first.

use serde_json::Value;

use super::events::{Severity, severity};
use super::fleet::{duration_words, rfc3339_seconds};
use crate::api::{AuditEntry, KeptEvent};

/// One line of a seat's timeline.
#[derive(Clone, Debug, PartialEq)]
pub struct TimelineItem {
    /// A key unique on the page (`e{id}` for an event, `a{n}` an action).
    pub key: String,
    /// RFC 3339.
    pub at: String,
    /// `turn`, `event` or `action`.
    pub kind: &'static str,
    pub title: String,
    pub detail: String,
    pub severity: Severity,
    /// The node it happened on (or was done through).
    pub node: String,
    pub turn_id: Option<String>,
}

fn text(v: &Value, k: &str) -> String {
    match v.get(k) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

/// Pure: what the event `name` with fields `v` says, as a title and a
/// detail.
fn words(name: &str, v: &Value) -> (String, String) {
    let by = |verb: &str| {
        let who = text(v, "by");
        if who.is_empty() {
            verb.to_string()
        } else {
            format!("{verb} by {who}")
        }
    };
    match name {
        "seat_paused" => (by("paused"), text(v, "reason")),
        "seat_resumed" => (by("resumed"), String::new()),
        "turn_stop_requested" => (by("turn stop asked"), String::new()),
        "seat_claimed" => (
            format!("taken by {}", text(v, "node")),
            format!("epoch {}", text(v, "epoch")),
        ),
        "seat_attached" => (
            format!("running on {}", text(v, "node")),
            format!("epoch {}", text(v, "epoch")),
        ),
        "seat_detached" => (
            format!("given up by {}", text(v, "node")),
            text(v, "reason"),
        ),
        "seat_offered" => (
            format!("handed over by {}", text(v, "node")),
            format!("to {}", text(v, "to")),
        ),
        "seat_offer_taken" => (format!("taken over by {}", text(v, "node")), String::new()),
        "turn.guard_breach" => ("a turn panicked".into(), text(v, "error")),
        "message_dead_lettered" => ("mail dead-lettered".into(), text(v, "reason")),
        "turn_trigger_skipped" => (
            format!("mail {} not run again", text(v, "trigger_id")),
            text(v, "reason"),
        ),
        _ => (name.replace('_', " "), summary(v)),
    }
}

/// Pure: the fields of an event a person has not already read elsewhere
/// on its line, `key=value`, bounded.
fn summary(v: &Value) -> String {
    let Some(map) = v.as_object() else {
        return String::new();
    };
    let s = map
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "event" | "node" | "incarnation" | "at" | "seat"))
        .map(|(k, v)| match v {
            Value::String(s) => format!("{k}={s}"),
            other => format!("{k}={other}"),
        })
        .collect::<Vec<_>>()
        .join(" · ");
    super::seats::clipped(&s, 200)
}

/// Pure: how a finished turn reads, from its `turn_completed` fields and
/// how long it ran (seconds, when its start is on the page).
fn turn_words(v: &Value, seconds: Option<f64>) -> (String, String, Severity) {
    let outcome = text(v, "outcome");
    let mut parts = Vec::new();
    // The turn's own measure when it carries one (its events' times are
    // whole seconds).
    let measured = v
        .get("duration_ms")
        .and_then(Value::as_u64)
        .filter(|ms| *ms > 0)
        .map(|ms| ms as f64 / 1000.0);
    if let Some(s) = measured.or(seconds) {
        parts.push(if s < 1.0 {
            format!("{} ms", (s * 1000.0).round() as u64)
        } else {
            duration_words(s.round() as u64)
        });
    }
    let rounds = text(v, "rounds");
    parts.push(format!(
        "{rounds} round{}",
        if rounds == "1" { "" } else { "s" }
    ));
    let tokens = text(v, "tokens");
    if !tokens.is_empty() {
        parts.push(format!("{tokens} tokens"));
    }
    if text(v, "disposition") == "nak" {
        parts.push("handed back to run again".into());
    }
    let error = text(v, "error");
    if !error.is_empty() {
        parts.push(error);
    }
    let sev = match outcome.as_str() {
        "completed" | "parked" | "stopped" => Severity::Info,
        "panicked" => Severity::Error,
        _ => Severity::Warning,
    };
    (format!("turn {outcome}"), parts.join(" · "), sev)
}

/// Pure: the timeline of `events` (newest first, as kept) and `actions`
/// (newest first), newest first. A turn whose start and end are both on
/// the page is one line, at its end; a start alone is a turn running.
pub fn timeline(events: &[KeptEvent], actions: &[AuditEntry]) -> Vec<TimelineItem> {
    let parsed: Vec<(&KeptEvent, Value)> = events
        .iter()
        .map(|e| (e, serde_json::from_str(&e.data).unwrap_or_default()))
        .collect();
    let started_at = |turn: &str| {
        parsed.iter().find_map(|(e, v)| {
            (e.name == "turn_started" && text(v, "turn_id") == turn).then(|| text(v, "at"))
        })
    };
    let finished = |turn: &str| {
        parsed
            .iter()
            .any(|(e, v)| e.name == "turn_completed" && text(v, "turn_id") == turn)
    };
    let mut items = Vec::new();
    for (e, v) in &parsed {
        let at = text(v, "at");
        let turn = Some(text(v, "turn_id")).filter(|t| !t.is_empty());
        let (kind, title, detail, sev) = match e.name.as_str() {
            "turn_started" if turn.as_deref().is_some_and(finished) => continue,
            "turn_started" => (
                "turn",
                "turn running".to_string(),
                format!("mail {}", text(v, "trigger_ids")),
                Severity::Info,
            ),
            "turn_completed" => {
                let seconds = turn
                    .as_deref()
                    .and_then(started_at)
                    .and_then(|s| Some(rfc3339_seconds(&at)? - rfc3339_seconds(&s)?));
                let (title, detail, sev) = turn_words(v, seconds);
                ("turn", title, detail, sev)
            }
            name => {
                let (title, detail) = words(name, v);
                ("event", title, detail, severity(name))
            }
        };
        items.push(TimelineItem {
            key: format!("e{}", e.id),
            at,
            kind,
            title,
            detail,
            severity: sev,
            node: text(v, "node"),
            turn_id: turn,
        });
    }
    for (i, a) in actions.iter().enumerate() {
        let refused = a.result.starts_with("refused");
        items.push(TimelineItem {
            key: format!("a{i}"),
            at: a.at.clone(),
            kind: "action",
            title: format!("{}: {}", a.person, a.action.replace(['_', '.'], " ")),
            detail: [a.reason.clone().unwrap_or_default(), a.result.clone()]
                .into_iter()
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join(" · "),
            severity: if refused {
                Severity::Warning
            } else {
                Severity::Info
            },
            node: a.node.clone().unwrap_or_default(),
            turn_id: None,
        });
    }
    // Newest first; one instant keeps the kept order (events before actions).
    items.sort_by(|a, b| b.at.cmp(&a.at));
    items
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(id: u64, name: &str, fields: Value) -> KeptEvent {
        let mut v = fields;
        v["event"] = Value::String(name.into());
        v["node"] = Value::String("n1".into());
        v["seat"] = Value::String("alpha".into());
        KeptEvent {
            id,
            name: name.into(),
            data: v.to_string(),
        }
    }

    #[test]
    fn a_turn_is_one_line_from_its_start_to_its_end_and_a_pause_names_who_made_it() {
        let events = vec![
            ev(
                4,
                "seat_paused",
                serde_json::json!({"at": "2026-12-01T10:00:09Z", "by": "olga", "reason": "deploy"}),
            ),
            ev(
                3,
                "turn_completed",
                serde_json::json!({"at": "2026-12-01T10:00:03.500Z", "turn_id": "t1", "outcome": "completed",
                    "rounds": 2, "tokens": 40, "disposition": "ack"}),
            ),
            ev(
                2,
                "turn_started",
                serde_json::json!({"at": "2026-12-01T10:00:02Z", "turn_id": "t1", "trigger_ids": ["m1"]}),
            ),
            ev(
                1,
                "turn_started",
                serde_json::json!({"at": "2026-12-01T09:59:00Z", "turn_id": "t0", "trigger_ids": ["m0"]}),
            ),
        ];
        let actions = vec![AuditEntry {
            at: "2026-12-01T10:00:08Z".into(),
            person: "olga".into(),
            action: "seat.pause".into(),
            seat: Some("alpha".into()),
            reason: Some("deploy".into()),
            result: "paused".into(),
            node: Some("n1".into()),
        }];
        let t = timeline(&events, &actions);
        let lines: Vec<(&str, &str, &str)> = t
            .iter()
            .map(|i| (i.kind, i.title.as_str(), i.detail.as_str()))
            .collect();
        assert_eq!(
            lines,
            vec![
                ("event", "paused by olga", "deploy"),
                ("action", "olga: seat pause", "deploy · paused"),
                ("turn", "turn completed", "2 s · 2 rounds · 40 tokens"),
                ("turn", "turn running", "mail [\"m0\"]"),
            ]
        );
        assert_eq!(t[2].turn_id.as_deref(), Some("t1"));
    }

    #[test]
    fn a_failed_turn_handed_back_says_so_and_a_panic_is_red() {
        let events = vec![
            ev(
                2,
                "turn_completed",
                serde_json::json!({"at": "2026-12-01T10:00:00Z", "turn_id": "t2", "outcome": "failed",
                    "rounds": 1, "disposition": "nak", "error": "the model endpoint failed: 503"}),
            ),
            ev(
                1,
                "turn.guard_breach",
                serde_json::json!({"at": "2026-12-01T09:00:00Z", "turn_id": "t1", "error": "boom"}),
            ),
        ];
        let t = timeline(&events, &[]);
        assert_eq!(
            t[0].detail,
            "1 round · handed back to run again · the model endpoint failed: 503"
        );
        assert_eq!(t[0].severity, Severity::Warning);
        assert_eq!(
            (t[1].title.as_str(), t[1].severity),
            ("a turn panicked", Severity::Error)
        );
    }

    #[test]
    fn a_turn_that_carries_its_duration_reads_it_rather_than_its_events_times() {
        let events = vec![ev(
            3,
            "turn_completed",
            serde_json::json!({"at": "2026-12-01T10:00:03Z", "turn_id": "t1", "outcome": "completed",
                "rounds": 1, "disposition": "ack", "duration_ms": 42}),
        )];
        let t = timeline(&events, &[]);
        assert!(
            t[0].detail.starts_with("42 ms · 1 round"),
            "{}",
            t[0].detail
        );
    }
}
