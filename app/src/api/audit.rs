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
}

/// A live node that did not answer an audit read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SilentNode {
    pub node_id: String,
    pub why: String,
}
