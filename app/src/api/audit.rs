//! The fleet's audit log as the Audit page shows it: each node's audited
//! actions and the nodes that did not answer.

use serde::{Deserialize, Serialize};

/// One audited action of a person.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    pub at: String,
    pub person: String,
    pub action: String,
    pub seat: Option<String>,
    pub reason: Option<String>,
    pub result: String,
    /// The node the action was taken through (every node keeps its own
    /// audit log; the Audit page gathers the fleet's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// The fleet's audit log as one node gathered it: the newest actions of
/// every node that answered, newest first, and the live nodes whose
/// actions are missing because they did not answer in time.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditView {
    pub entries: Vec<AuditEntry>,
    /// The nodes whose actions are listed, the node asked first.
    pub answered: Vec<String>,
    /// Live nodes whose actions are not listed, each with why.
    pub silent: Vec<SilentNode>,
    /// Set when the fleet's roster could not be read: only this node's
    /// actions are listed, and this says why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roster_error: Option<String>,
    /// The page shown (1: the newest).
    #[serde(default)]
    pub page: u32,
    /// Older matching actions are kept (ask for the next page).
    #[serde(default)]
    pub more: bool,
}

/// Actions on one Audit page.
pub const AUDIT_PAGE: u32 = 200;

/// Which actions an audit read lists: each given field must match exactly
/// (`refused`: only refusals).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditFilter {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seat: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub person: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub refused: bool,
}

impl AuditFilter {
    /// Pure: does `e` pass?
    pub fn admits(&self, e: &AuditEntry) -> bool {
        self.seat
            .as_ref()
            .is_none_or(|s| e.seat.as_ref() == Some(s))
            && self.person.as_ref().is_none_or(|p| &e.person == p)
            && self.action.as_ref().is_none_or(|a| &e.action == a)
            && (!self.refused || is_refusal(&e.result))
    }

    /// Only `seat`'s actions.
    pub fn seat(seat: &str) -> AuditFilter {
        AuditFilter {
            seat: Some(seat.to_string()),
            ..AuditFilter::default()
        }
    }
}

/// Pure: is an audit result a refusal ("refused: …")?
pub fn is_refusal(result: &str) -> bool {
    result.starts_with("refused")
}

/// A live node that did not answer an audit read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SilentNode {
    pub node_id: String,
    pub why: String,
}
