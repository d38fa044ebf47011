//! Memory: a seat's memory answered by the node that holds it. The same
//! shapes travel from a holder to the node that asked it, and from the
//! node to the browser.

use serde::{Deserialize, Serialize};

/// The node holding a seat, as a memory read names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryHolder {
    pub node_id: String,
    pub incarnation: String,
    pub epoch: u64,
}

/// The node that gave an answer: the epoch of the tenure it answered
/// under (none when it does not hold the seat), and whether it is the node
/// that was asked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryAnswerer {
    pub node_id: String,
    pub incarnation: String,
    pub epoch: Option<u64>,
    pub local: bool,
}

/// Why a held seat's memory cannot be had right now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum MemoryUnavailable {
    /// The holder is still replaying the seat's memory (establishing it).
    Hydrating,
    /// The holder is giving the seat back, or cannot prove its teardown.
    Releasing,
    /// The holder says it does not hold the seat: the lease moved.
    NotHeldHere,
    /// The holder did not answer within the budget.
    Silent { budget_ms: u64 },
    /// Nothing answers for the holder: its process is gone.
    NoResponder,
    /// The holder answered, but could not read the seat's memory.
    HolderFailed { message: String },
    /// The holder could not be asked, or its answer could not be read.
    AskFailed { message: String },
}

impl MemoryUnavailable {
    /// The reason's name, as the JSON `kind` carries it.
    pub fn kind(&self) -> &'static str {
        match self {
            MemoryUnavailable::Hydrating => "hydrating",
            MemoryUnavailable::Releasing => "releasing",
            MemoryUnavailable::NotHeldHere => "not_held_here",
            MemoryUnavailable::Silent { .. } => "silent",
            MemoryUnavailable::NoResponder => "no_responder",
            MemoryUnavailable::HolderFailed { .. } => "holder_failed",
            MemoryUnavailable::AskFailed { .. } => "ask_failed",
        }
    }
}

/// One seat's answer, tagged by `state`: the seat's rows for a read
/// ([`SeatMemoryRead`]), its rows per table in an overview
/// ([`SeatMemoryCounts`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum MemoryAnswer<T> {
    /// The holder's own copy, answered by the holder.
    Held {
        handle: String,
        holder: MemoryHolder,
        answered_by: MemoryAnswerer,
        memory: T,
    },
    /// No node holds the seat: nothing is shown (a copy of unknown age is
    /// not the seat's memory).
    Unheld {
        handle: String,
        answered_by: MemoryAnswerer,
        memory: T,
    },
    /// The seat is held but its holder's copy cannot be had now: never
    /// shown as empty.
    Unavailable {
        handle: String,
        holder: MemoryHolder,
        answered_by: MemoryAnswerer,
        reason: MemoryUnavailable,
        /// The reason in words, naming the holder's node.
        why: String,
    },
}

impl<T> MemoryAnswer<T> {
    pub fn handle(&self) -> &str {
        match self {
            MemoryAnswer::Held { handle, .. }
            | MemoryAnswer::Unheld { handle, .. }
            | MemoryAnswer::Unavailable { handle, .. } => handle,
        }
    }

    pub fn answered_by(&self) -> &MemoryAnswerer {
        match self {
            MemoryAnswer::Held { answered_by, .. }
            | MemoryAnswer::Unheld { answered_by, .. }
            | MemoryAnswer::Unavailable { answered_by, .. } => answered_by,
        }
    }

    /// `held`, `unheld` or `unavailable`.
    pub fn state(&self) -> &'static str {
        match self {
            MemoryAnswer::Held { .. } => "held",
            MemoryAnswer::Unheld { .. } => "unheld",
            MemoryAnswer::Unavailable { .. } => "unavailable",
        }
    }

    /// The lease holder (none when nobody holds the seat).
    pub fn holder(&self) -> Option<&MemoryHolder> {
        match self {
            MemoryAnswer::Held { holder, .. } | MemoryAnswer::Unavailable { holder, .. } => {
                Some(holder)
            }
            MemoryAnswer::Unheld { .. } => None,
        }
    }

    /// The memory (none when unavailable).
    pub fn memory(&self) -> Option<&T> {
        match self {
            MemoryAnswer::Held { memory, .. } | MemoryAnswer::Unheld { memory, .. } => Some(memory),
            MemoryAnswer::Unavailable { .. } => None,
        }
    }

    /// Why the memory cannot be had (unavailable only).
    pub fn unavailable(&self) -> Option<&MemoryUnavailable> {
        match self {
            MemoryAnswer::Unavailable { reason, .. } => Some(reason),
            _ => None,
        }
    }

    /// The same answer with its memory made into `f(memory)`.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> MemoryAnswer<U> {
        match self {
            MemoryAnswer::Held {
                handle,
                holder,
                answered_by,
                memory,
            } => MemoryAnswer::Held {
                handle,
                holder,
                answered_by,
                memory: f(memory),
            },
            MemoryAnswer::Unheld {
                handle,
                answered_by,
                memory,
            } => MemoryAnswer::Unheld {
                handle,
                answered_by,
                memory: f(memory),
            },
            MemoryAnswer::Unavailable {
                handle,
                holder,
                answered_by,
                reason,
                why,
            } => MemoryAnswer::Unavailable {
                handle,
                holder,
                answered_by,
                reason,
                why,
            },
        }
    }
}

/// One diary note.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DiaryRow {
    pub id: String,
    pub content: String,
    pub work_key: Option<String>,
    pub created_at: String,
    pub expires_at: Option<String>,
}

/// One episode: a unit of work the seat did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct EpisodeRow {
    pub id: String,
    pub work_key: Option<String>,
    pub summary: String,
    pub turn_id: String,
    pub created_at: String,
}

/// What the seat knows of one counterparty.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CounterpartyRow {
    pub id: String,
    pub counterparty: String,
    pub interaction_count: i64,
    pub last_work_key: Option<String>,
    pub updated_at: String,
}

/// One skill.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SkillRow {
    pub id: String,
    pub name: String,
    pub state: String,
    pub use_count: i64,
    pub updated_at: String,
}

/// One version of a skill.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SkillVersionRow {
    pub id: String,
    pub skill_name: String,
    pub version: i64,
    pub body: String,
    pub created_at: String,
}

/// One onboarding marker.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct MarkerRow {
    pub id: String,
    pub marker: String,
    pub value: String,
    pub updated_at: String,
}

/// One entry of the conversation ledger.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ConversationRow {
    pub id: String,
    pub thread: String,
    pub message_id: Option<String>,
    pub author: String,
    pub text: String,
    pub at: String,
}

/// A seat's memory: the newest rows of each table, newest first.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SeatMemoryRows {
    pub diary: Vec<DiaryRow>,
    pub episodes: Vec<EpisodeRow>,
    pub counterparty_profiles: Vec<CounterpartyRow>,
    pub skills: Vec<SkillRow>,
    pub skill_versions: Vec<SkillVersionRow>,
    pub onboarding_markers: Vec<MarkerRow>,
    pub conversations: Vec<ConversationRow>,
}

/// A seat's rows per table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct MemoryCounts {
    pub diary: u64,
    pub episodes: u64,
    pub counterparty_profiles: u64,
    pub skills: u64,
    pub skill_versions: u64,
    pub onboarding_markers: u64,
    pub conversations: u64,
}

impl MemoryCounts {
    /// Rows over every table.
    pub fn total(&self) -> u64 {
        self.diary
            + self.episodes
            + self.counterparty_profiles
            + self.skills
            + self.skill_versions
            + self.onboarding_markers
            + self.conversations
    }

    /// Add `o`'s rows, table by table.
    fn add(&mut self, o: &MemoryCounts) {
        self.diary += o.diary;
        self.episodes += o.episodes;
        self.counterparty_profiles += o.counterparty_profiles;
        self.skills += o.skills;
        self.skill_versions += o.skill_versions;
        self.onboarding_markers += o.onboarding_markers;
        self.conversations += o.conversations;
    }
}

/// A read of one seat's memory.
pub type SeatMemoryRead = MemoryAnswer<SeatMemoryRows>;
/// One seat of the memory overview.
pub type SeatMemoryCounts = MemoryAnswer<MemoryCounts>;

/// Rows of each table a memory read returns (the newest).
pub const MEMORY_ROWS_SHOWN: u32 = 100;

/// Seats on one page of the memory overview.
pub const MEMORY_PAGE_SIZE: u32 = 50;

/// One holder in the overview's coverage.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HolderCoverage {
    pub node_id: String,
    pub incarnation: String,
    /// The node that was asked (its seats were read from its own store).
    pub local: bool,
    /// The seats it holds.
    pub seats: Vec<String>,
    /// Why it did not answer (unanswered only).
    #[serde(default)]
    pub reason: Option<MemoryUnavailable>,
    #[serde(default)]
    pub why: Option<String>,
}

/// Which holders answered the overview and which did not.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryCoverage {
    pub answered: Vec<HolderCoverage>,
    pub unanswered: Vec<HolderCoverage>,
}

/// Every seat's memory in one round: rows per table, who answered each,
/// and which holders answered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryOverview {
    /// The node that was asked.
    pub node_id: String,
    pub incarnation: String,
    /// Every seat held or in the company, by handle.
    pub seats: Vec<SeatMemoryCounts>,
    pub coverage: MemoryCoverage,
}

impl MemoryOverview {
    pub fn seat(&self, handle: &str) -> Option<&SeatMemoryCounts> {
        self.seats.iter().find(|s| s.handle() == handle)
    }

    /// The seats no node holds.
    pub fn unheld(&self) -> Vec<&str> {
        self.seats
            .iter()
            .filter(|s| matches!(s, MemoryAnswer::Unheld { .. }))
            .map(|s| s.handle())
            .collect()
    }
}

/// One page of the memory overview, as the Memory page shows it: the
/// seats whose handle contains the query, with the coverage and the totals
/// of every seat.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryOverviewPage {
    pub node_id: String,
    pub coverage: MemoryCoverage,
    /// Seats in the overview.
    pub total: usize,
    /// How many are held / unheld / unavailable.
    pub held: usize,
    pub unheld: usize,
    pub unavailable: usize,
    /// Rows per table over every seat answered.
    pub rows: MemoryCounts,
    /// Seats matching the query (every page together).
    pub matching: usize,
    /// The page shown (1-based; the last page when the one asked for is
    /// past the end).
    pub page: u32,
    pub pages: u32,
    pub seats: Vec<SeatMemoryCounts>,
}

impl MemoryOverviewPage {
    /// Page `page` of `overview`'s seats whose handle contains `query`
    /// (case-insensitive).
    pub fn of(overview: MemoryOverview, query: &str, page: u32) -> MemoryOverviewPage {
        let mut rows = MemoryCounts::default();
        let (mut held, mut unheld, mut unavailable) = (0, 0, 0);
        for s in &overview.seats {
            match s {
                MemoryAnswer::Held { memory, .. } => {
                    held += 1;
                    rows.add(memory);
                }
                MemoryAnswer::Unheld { memory, .. } => {
                    unheld += 1;
                    rows.add(memory);
                }
                MemoryAnswer::Unavailable { .. } => unavailable += 1,
            }
        }
        let total = overview.seats.len();
        let text = query.trim().to_lowercase();
        let matched: Vec<SeatMemoryCounts> = overview
            .seats
            .into_iter()
            .filter(|s| text.is_empty() || s.handle().to_lowercase().contains(&text))
            .collect();
        let matching = matched.len();
        let size = MEMORY_PAGE_SIZE as usize;
        let pages = matching.div_ceil(size).max(1) as u32;
        let page = page.clamp(1, pages);
        let seats = matched
            .into_iter()
            .skip((page as usize - 1) * size)
            .take(size)
            .collect();
        MemoryOverviewPage {
            node_id: overview.node_id,
            coverage: overview.coverage,
            total,
            held,
            unheld,
            unavailable,
            rows,
            matching,
            page,
            pages,
            seats,
        }
    }
}

/// Answers for the unit tests of the memory types and their views.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::{MemoryAnswerer, MemoryHolder};

    pub fn holder(node: &str, epoch: u64) -> MemoryHolder {
        MemoryHolder {
            node_id: node.into(),
            incarnation: format!("{node}:1"),
            epoch,
        }
    }

    pub fn by(node: &str, epoch: Option<u64>, local: bool) -> MemoryAnswerer {
        MemoryAnswerer {
            node_id: node.into(),
            incarnation: format!("{node}:1"),
            epoch,
            local,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_overview_page_filters_pages_and_totals_every_seat() {
        let seat = |i: usize| -> SeatMemoryCounts {
            if i % 10 == 9 {
                MemoryAnswer::Unavailable {
                    handle: format!("seat-{i:03}"),
                    holder: holder("n2", 1),
                    answered_by: by("n1", None, true),
                    reason: MemoryUnavailable::NoResponder,
                    why: String::new(),
                }
            } else {
                MemoryAnswer::Held {
                    handle: format!("seat-{i:03}"),
                    holder: holder("n1", 1),
                    answered_by: by("n1", Some(1), true),
                    memory: MemoryCounts {
                        episodes: 2,
                        ..Default::default()
                    },
                }
            }
        };
        let overview = MemoryOverview {
            node_id: "n1".into(),
            incarnation: "n1:1".into(),
            seats: (0..120).map(seat).collect(),
            coverage: MemoryCoverage::default(),
        };
        let p = MemoryOverviewPage::of(overview.clone(), "", 3);
        assert_eq!(
            (p.total, p.held, p.unavailable, p.unheld),
            (120, 108, 12, 0)
        );
        assert_eq!(p.rows.episodes, 216);
        assert_eq!(
            (p.matching, p.page, p.pages, p.seats.len()),
            (120, 3, 3, 20)
        );
        assert_eq!(p.seats[0].handle(), "seat-100");
        let p = MemoryOverviewPage::of(overview.clone(), " SEAT-01", 9);
        assert_eq!((p.matching, p.page, p.pages), (10, 1, 1));
        assert_eq!(p.total, 120, "the totals are of every seat");
    }

    use super::fixtures::{by, holder};

    #[test]
    fn memory_answers_keep_the_memread_json_shape() {
        let v = serde_json::json!({
            "state": "unavailable", "handle": "a",
            "holder": {"node_id": "n1", "incarnation": "n1:1", "epoch": 4},
            "answered_by": {"node_id": "n2", "incarnation": "n2:1", "epoch": null, "local": true},
            "reason": {"kind": "silent", "budget_ms": 1500},
            "why": "the holder n1 did not answer within 1500 ms"
        });
        let a: SeatMemoryCounts = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(a.state(), "unavailable");
        assert_eq!(a.who_answered(), "holder n1 did not answer within 1500 ms");
        assert_eq!(serde_json::to_value(&a).unwrap(), v);
    }
}
