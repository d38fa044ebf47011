//! The Memory page's answers: [`MemRead`](crate::memory::memread::MemRead)'s
//! reads and overview, in the shapes the browser and the JSON API share
//! (`app::api`). The JSON keeps the shape documented in
//! [`crate::memory::memread`]; a row carries its table's columns but the
//! seat's handle, its content hash and its vector.

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use app::api::{
    HolderCoverage as ApiHolderCoverage, MemoryAnswer, MemoryAnswerer, MemoryCounts as ApiCounts,
    MemoryCoverage, MemoryHolder, MemoryOverview, MemoryUnavailable, SeatMemoryCounts,
    SeatMemoryRead, SeatMemoryRows,
};

use crate::memory::SeatMemory;
use crate::memory::memread::{
    Answerer, Coverage, Holder, HolderCoverage, MemoryCounts, Overview, SeatAnswer, Unavailable,
};

fn holder(h: Holder) -> MemoryHolder {
    MemoryHolder {
        node_id: h.node_id,
        incarnation: h.incarnation,
        epoch: h.epoch,
    }
}

fn answerer(a: Answerer) -> MemoryAnswerer {
    MemoryAnswerer {
        node_id: a.node_id,
        incarnation: a.incarnation,
        epoch: a.epoch,
        local: a.local,
    }
}

fn reason(r: Unavailable) -> MemoryUnavailable {
    match r {
        Unavailable::Hydrating => MemoryUnavailable::Hydrating,
        Unavailable::Releasing => MemoryUnavailable::Releasing,
        Unavailable::NotHeldHere => MemoryUnavailable::NotHeldHere,
        Unavailable::Silent { budget_ms } => MemoryUnavailable::Silent { budget_ms },
        Unavailable::NoResponder => MemoryUnavailable::NoResponder,
        Unavailable::HolderFailed { message } => MemoryUnavailable::HolderFailed { message },
        Unavailable::AskFailed { message } => MemoryUnavailable::AskFailed { message },
    }
}

fn answer<T, U>(a: SeatAnswer<T>, memory: impl FnOnce(T) -> U) -> MemoryAnswer<U> {
    match a {
        SeatAnswer::Held {
            handle,
            holder: h,
            answered_by,
            memory: m,
        } => MemoryAnswer::Held {
            handle,
            holder: holder(h),
            answered_by: answerer(answered_by),
            memory: memory(m),
        },
        SeatAnswer::Unheld {
            handle,
            answered_by,
            memory: m,
        } => MemoryAnswer::Unheld {
            handle,
            answered_by: answerer(answered_by),
            memory: memory(m),
        },
        SeatAnswer::Unavailable {
            handle,
            holder: h,
            answered_by,
            reason: r,
            why,
        } => MemoryAnswer::Unavailable {
            handle,
            holder: holder(h),
            answered_by: answerer(answered_by),
            reason: reason(r),
            why,
        },
    }
}

/// The rows of one table, typed; a row that does not read as its table's
/// columns is left out (and logged).
fn typed<T: DeserializeOwned>(table: &str, rows: Vec<Map<String, Value>>) -> Vec<T> {
    rows.into_iter()
        .filter_map(|r| match serde_json::from_value(Value::Object(r)) {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!(table, error = %e, "a memory row does not read as its table");
                None
            }
        })
        .collect()
}

fn rows(m: SeatMemory) -> SeatMemoryRows {
    SeatMemoryRows {
        diary: typed("agent_diary", m.diary),
        episodes: typed("episodes", m.episodes),
        counterparty_profiles: typed("counterparty_profiles", m.counterparty_profiles),
        skills: typed("skills", m.skills),
        skill_versions: typed("skill_versions", m.skill_versions),
        onboarding_markers: typed("agent_onboarding_markers", m.onboarding_markers),
        conversations: typed("conversations", m.conversations),
    }
}

fn counts(c: MemoryCounts) -> ApiCounts {
    ApiCounts {
        diary: c.diary,
        episodes: c.episodes,
        counterparty_profiles: c.counterparty_profiles,
        skills: c.skills,
        skill_versions: c.skill_versions,
        onboarding_markers: c.onboarding_markers,
        conversations: c.conversations,
    }
}

/// A seat's memory read, as the page and `GET /api/seats/{handle}/memory`
/// show it.
pub fn seat_read(a: SeatAnswer<SeatMemory>) -> SeatMemoryRead {
    answer(a, rows)
}

fn coverage_entry(h: HolderCoverage) -> ApiHolderCoverage {
    ApiHolderCoverage {
        node_id: h.node_id,
        incarnation: h.incarnation,
        local: h.local,
        seats: h.seats,
        reason: h.reason.map(reason),
        why: h.why,
    }
}

fn coverage(c: Coverage) -> MemoryCoverage {
    MemoryCoverage {
        answered: c.answered.into_iter().map(coverage_entry).collect(),
        unanswered: c.unanswered.into_iter().map(coverage_entry).collect(),
    }
}

/// The overview, as the page and `GET /api/memory` show it.
pub fn overview(o: Overview) -> MemoryOverview {
    MemoryOverview {
        node_id: o.node_id,
        incarnation: o.incarnation,
        seats: o
            .seats
            .into_iter()
            .map(|s| -> SeatMemoryCounts { answer(s, counts) })
            .collect(),
        coverage: coverage(o.coverage),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_shows_as_many_rows_as_a_read_returns() {
        assert_eq!(
            app::api::MEMORY_ROWS_SHOWN,
            crate::memory::memread::READ_LIMIT
        );
    }

    #[test]
    fn rows_keep_their_columns_and_the_answer_its_shape() {
        let mut note = Map::new();
        for (k, v) in [
            ("id", Value::from("d1")),
            ("agent_handle", Value::from("alpha")),
            ("content", Value::from("wrote the report")),
            ("content_hash", Value::from("ab")),
            ("work_key", Value::Null),
            ("created_at", Value::from("2026-11-30T08:00:00Z")),
            ("expires_at", Value::from("2026-12-30T08:00:00Z")),
        ] {
            note.insert(k.into(), v);
        }
        let read = seat_read(SeatAnswer::Held {
            handle: "alpha".into(),
            holder: Holder {
                node_id: "n1".into(),
                incarnation: "n1:1".into(),
                epoch: 7,
            },
            answered_by: Answerer {
                node_id: "n1".into(),
                incarnation: "n1:1".into(),
                epoch: Some(7),
                local: false,
            },
            memory: SeatMemory {
                diary: vec![note],
                ..Default::default()
            },
        });
        assert_eq!(read.who_answered(), "answered by n1 (holder, epoch 7)");
        let v = serde_json::to_value(&read).unwrap();
        assert_eq!(v["state"], "held");
        assert_eq!(v["holder"]["epoch"], 7);
        assert_eq!(v["memory"]["diary"][0]["content"], "wrote the report");
        assert_eq!(
            v["memory"]["diary"][0]["expires_at"],
            "2026-12-30T08:00:00Z"
        );
        assert!(v["memory"]["diary"][0].get("agent_handle").is_none());
    }
}
