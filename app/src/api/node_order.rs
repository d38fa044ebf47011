//! The node priority order and "move this seat now": the order the fleet
//! ranks its nodes by, and a person's request that a seat run on a node.

use serde::{Deserialize, Serialize};

/// The fleet's node priority order (`GET /api/nodes/order`): what was
/// saved, and the order every node ranks the live fleet by now.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeOrderView {
    /// The order as a person saved it (top first); empty when never saved.
    pub saved: Vec<String>,
    /// The live nodes, top priority first: the saved order over the nodes
    /// present, newcomers appended in first-seen order, absent ones dropped.
    pub effective: Vec<String>,
    /// Who saved it, and when (RFC 3339); `None` when never saved.
    pub set_by: Option<String>,
    pub set_at: Option<String>,
    /// The revision to save against (`PUT` with it); `None` when never saved.
    pub revision: Option<u64>,
}

/// A person's request that a seat run on a named node, as recorded
/// (`POST /api/seats/{handle}/move` answers it with 202).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveRequestView {
    pub seat: String,
    /// The target node id.
    pub to: String,
    pub by: String,
    pub reason: String,
    /// RFC 3339, on the coordination store's clock.
    pub requested_at: String,
    /// When the request lapses if the target never takes the seat.
    pub until: String,
}
