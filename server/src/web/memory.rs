//! The Memory page's answers: [`MemRead`](crate::memory::memread::MemRead)'s
//! reads and overview, which already are the shapes the browser and the
//! JSON API share (`app::api`, documented in [`crate::memory::memread`]).
//! A read's rows are typed per table here: a row carries its table's
//! columns but the seat's handle, its content hash and its vector.

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use app::api::{SeatMemoryRead, SeatMemoryRows};

use crate::memory::SeatMemory;
use crate::memory::memread::SeatRead;

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

/// A seat's memory read, as the page and `GET /api/seats/{handle}/memory`
/// show it: the holder's answer, its rows typed per table.
pub fn seat_read(a: SeatRead) -> SeatMemoryRead {
    a.map(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use app::api::{MemoryAnswer, MemoryAnswerer, MemoryHolder};

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
        let read = seat_read(MemoryAnswer::Held {
            handle: "alpha".into(),
            holder: MemoryHolder {
                node_id: "n1".into(),
                incarnation: "n1:1".into(),
                epoch: 7,
            },
            answered_by: MemoryAnswerer {
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
