//! The Memory page's words: who answered a seat's memory, why a holder
//! gave none, and the names of the tables.

use crate::api::{MemoryAnswer, MemoryCounts, MemoryUnavailable};

impl MemoryUnavailable {
    /// What the holder did, as the end of a sentence that starts with the
    /// holder's name: "did not answer within 2 s".
    pub fn sentence(&self) -> String {
        match self {
            MemoryUnavailable::Hydrating => "is still loading the seat's memory".into(),
            MemoryUnavailable::Releasing => "is giving the seat back".into(),
            MemoryUnavailable::NotHeldHere => "says it does not hold the seat (it moved)".into(),
            MemoryUnavailable::Silent { budget_ms } => {
                let budget = if budget_ms % 1000 == 0 {
                    format!("{} s", budget_ms / 1000)
                } else {
                    format!("{budget_ms} ms")
                };
                format!("did not answer within {budget}")
            }
            MemoryUnavailable::NoResponder => "is not running (nothing answers for it)".into(),
            MemoryUnavailable::HolderFailed { message } => {
                format!("could not read the seat's memory: {message}")
            }
            MemoryUnavailable::AskFailed { message } => format!("could not be asked: {message}"),
        }
    }
}

impl<T> MemoryAnswer<T> {
    /// Who answered, in words: "answered by node-b (holder, epoch 7)",
    /// "no node holds this seat", "holder node-c did not answer within 2 s".
    pub fn who_answered(&self) -> String {
        match self {
            MemoryAnswer::Held {
                holder,
                answered_by,
                ..
            } => {
                if answered_by.incarnation == holder.incarnation {
                    format!(
                        "answered by {} (holder, epoch {})",
                        answered_by.node_id,
                        answered_by.epoch.unwrap_or(holder.epoch)
                    )
                } else {
                    format!(
                        "answered by {} for the holder {} (epoch {})",
                        answered_by.node_id, holder.node_id, holder.epoch
                    )
                }
            }
            MemoryAnswer::Unheld { .. } => "no node holds this seat".to_string(),
            MemoryAnswer::Unavailable { holder, reason, .. } => {
                format!("holder {} {}", holder.node_id, reason.sentence())
            }
        }
    }
}

impl MemoryCounts {
    /// The tables' names and counts, in the order pages list them.
    pub fn named(&self) -> [(&'static str, u64); 7] {
        [
            ("Diary", self.diary),
            ("Episodes", self.episodes),
            ("Counterparty profiles", self.counterparty_profiles),
            ("Skills", self.skills),
            ("Skill versions", self.skill_versions),
            ("Onboarding markers", self.onboarding_markers),
            ("Conversations", self.conversations),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{SeatMemoryRead, SeatMemoryRows};

    use crate::api::fixtures::{by, holder};

    #[test]
    fn a_memory_answer_says_who_answered() {
        let held: SeatMemoryRead = MemoryAnswer::Held {
            handle: "a".into(),
            holder: holder("node-b", 7),
            answered_by: by("node-b", Some(7), false),
            memory: SeatMemoryRows::default(),
        };
        assert_eq!(held.who_answered(), "answered by node-b (holder, epoch 7)");
        let unheld: SeatMemoryRead = MemoryAnswer::Unheld {
            handle: "a".into(),
            answered_by: by("node-a", None, true),
            memory: SeatMemoryRows::default(),
        };
        assert_eq!(unheld.who_answered(), "no node holds this seat");
        let silent: SeatMemoryRead = MemoryAnswer::Unavailable {
            handle: "a".into(),
            holder: holder("node-c", 3),
            answered_by: by("node-a", None, true),
            reason: MemoryUnavailable::Silent { budget_ms: 2000 },
            why: "the holder node-c did not answer within 2000 ms".into(),
        };
        assert_eq!(
            silent.who_answered(),
            "holder node-c did not answer within 2 s"
        );
    }
}
