//! Who this process is: its incarnation (the owner of every lease it
//! takes) and the node facts every part of it reports.

use rand::Rng;

use crate::config::{Config, CoordinationType, matches_placement, protocol};

/// A process incarnation: `{node_id}:{random}`, minted fresh at boot. The
/// owner of every lease this process takes (spec § The lease).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Incarnation(String);

impl Incarnation {
    pub fn mint(node_id: &str) -> Incarnation {
        let r: u32 = rand::thread_rng().r#gen();
        Incarnation(format!("{node_id}:{r:08x}"))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Incarnation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What this node is, as every part of it reports it.
#[derive(Clone, Debug)]
pub struct NodeInfo {
    pub node_id: String,
    pub incarnation: Incarnation,
    pub labels: Vec<String>,
    pub company: String,
    pub coordination: CoordinationType,
    pub protocol: u32,
    /// Handles of the roles whose placement this node matches.
    pub roles: Vec<String>,
}

impl NodeInfo {
    pub fn from_config(config: &Config, incarnation: Incarnation) -> NodeInfo {
        let roles = config
            .roles
            .iter()
            .filter(|r| matches_placement(&config.node.id, &config.node.labels, &r.placement))
            .map(|r| r.handle.clone())
            .collect();
        NodeInfo {
            node_id: config.node.id.clone(),
            incarnation,
            labels: config.node.labels.clone(),
            company: config.company.name.clone(),
            coordination: config.coordination.kind,
            protocol: protocol(),
            roles,
        }
    }
}
