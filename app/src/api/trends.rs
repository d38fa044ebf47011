//! The last hour, minute by minute, as each node keeps its own: the strip
//! per node on Settings › Nodes and a seat's inbox depth on its page.

use serde::{Deserialize, Serialize};

/// One minute of one node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeMinute {
    /// `YYYY-MM-DDTHH:MM`, UTC, on the node's clock.
    pub minute: String,
    /// The seats it held at the minute's last sample (none: it was not
    /// sampled).
    pub seats_held: Option<u64>,
    /// Turns it finished in the minute.
    pub turns: u64,
    /// Its coordination store calls' 99th percentile in the minute, in
    /// microseconds (none: no call was timed).
    pub store_p99_us: Option<u64>,
}

/// One node's last hour, or why it cannot be had.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeTrend {
    pub node_id: String,
    /// Oldest first, one a minute.
    pub minutes: Vec<NodeMinute>,
    /// Why the node's history could not be had (it did not answer, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The fleet's strips, as the node asked gathered them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FleetTrends {
    pub nodes: Vec<NodeTrend>,
    /// The minute the hour ends at (`YYYY-MM-DDTHH:MM`, UTC).
    pub to: String,
    /// Set when the roster could not be read: only the answering node's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roster_error: Option<String>,
}

/// One minute of a seat's inbox.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InboxMinute {
    /// `YYYY-MM-DDTHH:MM`, UTC.
    pub minute: String,
    /// The deepest it was seen in the minute (none: not sampled then).
    pub depth: Option<u64>,
    /// Its depth at the minute's last sample.
    #[serde(default)]
    pub latest: Option<u64>,
}
