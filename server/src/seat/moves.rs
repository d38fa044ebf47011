//! "Move this seat now": an operator's request that a seat run on a named
//! node (handoff § 8, the force claim, made safe in the lease world).
//!
//! It owns the move request — one record per seat, `move:{handle}` in the
//! handoffs bucket (`crewlet_handoffs`) — and the pure rules about it. A
//! request never takes anything by itself: the seat's live holder hands the
//! seat to the target through the two-phase handoff, and a holder whose
//! lease has lapsed is never robbed — the target claims the seat the moment
//! the lease is free, and every other node leaves it to the target while
//! the request stands. A request ends when the target holds the seat, or
//! when it expires (`until`, on the store's clock).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::company;
use crate::coord::{KvError, Lease, StateBucket, Store, StoreError, StoreTime};
use crate::seat::placement::matches_placement;

/// How long a request stands when its target never takes the seat.
pub const MOVE_STANDS_FOR: Duration = Duration::from_secs(120);

/// The request as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveRequest {
    pub seat: String,
    /// The target node id.
    pub to: String,
    /// Who asked (the signed-in person).
    pub by: String,
    pub reason: String,
    /// When it was asked, on the store's clock.
    pub requested_at: StoreTime,
    /// When it lapses if the target never takes the seat.
    pub until: StoreTime,
}

impl MoveRequest {
    /// Whether it still stands at `now`.
    pub fn stands(&self, now: StoreTime) -> bool {
        now < self.until
    }
}

/// Why a move was refused.
#[derive(Debug, thiserror::Error)]
pub enum MoveError {
    #[error("seat {0:?} is not in the active company")]
    UnknownSeat(String),
    #[error("node {0:?} is not a live node of the fleet (see Settings › Nodes for the live ones)")]
    UnknownNode(String),
    #[error(
        "node {node:?} is outside seat {seat:?}'s placement ({placement}); pick a node the placement names"
    )]
    OutsidePlacement {
        seat: String,
        node: String,
        placement: String,
    },
    #[error("node {0:?} is draining or has withdrawn its seats; it takes no seat")]
    NotServing(String),
    #[error("seat {seat:?} already runs on node {node:?}")]
    AlreadyThere { seat: String, node: String },
    #[error("a reason is required (say why the seat moves; it is audited)")]
    NoReason,
    #[error("no company is active yet")]
    NoCompany,
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the company cannot be read: {0}")]
    Company(String),
}

/// The key of `seat`'s request.
pub fn key(seat: &str) -> String {
    format!("move:{seat}")
}

/// What a live node's presence row says about serving, for a move.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub node_id: String,
    pub labels: Vec<String>,
    pub serving: bool,
}

/// Pure: may `seat` (with `placement`) move to `to`, given the live nodes
/// and the seat's current holder node id?
pub fn judge(
    seat: &str,
    placement: &crate::config::PlacementConfig,
    to: &str,
    live: &[Target],
    holder: Option<&str>,
) -> Result<(), MoveError> {
    let Some(t) = live.iter().find(|t| t.node_id == to) else {
        return Err(MoveError::UnknownNode(to.to_string()));
    };
    if !matches_placement(&t.node_id, &t.labels, placement) {
        return Err(MoveError::OutsidePlacement {
            seat: seat.to_string(),
            node: to.to_string(),
            placement: describe(placement),
        });
    }
    if !t.serving {
        return Err(MoveError::NotServing(to.to_string()));
    }
    if holder == Some(to) {
        return Err(MoveError::AlreadyThere {
            seat: seat.to_string(),
            node: to.to_string(),
        });
    }
    Ok(())
}

/// The live nodes as a move judges them (their presence rows).
pub async fn live_targets(store: &dyn Store) -> Result<Vec<Target>, StoreError> {
    Ok(store
        .list("node:")
        .await?
        .iter()
        .filter_map(target_of)
        .collect())
}

/// Pure: why `seat` (with `placement`, held on `holder`) cannot be moved
/// anywhere now — no live node but its holder would take it — or `None`
/// when some node would.
pub fn move_blocked(
    seat: &str,
    placement: &crate::config::PlacementConfig,
    live: &[Target],
    holder: Option<&str>,
) -> Option<String> {
    if live
        .iter()
        .any(|t| judge(seat, placement, &t.node_id, live, holder).is_ok())
    {
        return None;
    }
    let others = live
        .iter()
        .filter(|t| Some(t.node_id.as_str()) != holder)
        .count();
    Some(if others == 0 {
        "no other node is live: a move needs a second node".to_string()
    } else {
        format!(
            "no other live node may run it: its placement is {} and the others are outside it or not serving",
            describe(placement)
        )
    })
}

/// A placement in words.
pub fn describe(p: &crate::config::PlacementConfig) -> String {
    match (p.nodes.is_empty(), p.labels.is_empty()) {
        (true, true) => "any node".into(),
        (false, true) => format!("nodes {}", p.nodes.join(", ")),
        (true, false) => format!("labels {}", p.labels.join(", ")),
        (false, false) => format!(
            "nodes {}, labels {}",
            p.nodes.join(", "),
            p.labels.join(", ")
        ),
    }
}

fn target_of(lease: &Lease) -> Option<Target> {
    let node_id = lease.resource.strip_prefix("node:")?.to_string();
    let m = &lease.metadata;
    let flag = |k: &str| m.get(k).and_then(|v| v.as_bool()).unwrap_or(false);
    Some(Target {
        labels: m
            .get("labels")
            .and_then(|v| v.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default(),
        serving: !flag("draining") && !flag("seats_withdrawn"),
        node_id,
    })
}

/// Record an operator's request that `seat` run on node `to`. Refused with
/// the reason when the seat or node is unknown, the node is outside the
/// seat's placement or not serving, or the seat already runs there. A
/// request made again replaces the standing one.
pub async fn request(
    store: &dyn Store,
    seat: &str,
    to: &str,
    by: &str,
    reason: &str,
) -> Result<MoveRequest, MoveError> {
    if reason.trim().is_empty() {
        return Err(MoveError::NoReason);
    }
    let company = company::active(store)
        .await
        .map_err(|e| MoveError::Company(e.to_string()))?
        .ok_or(MoveError::NoCompany)?;
    let role = company
        .roles
        .iter()
        .find(|r| r.handle == seat)
        .ok_or_else(|| MoveError::UnknownSeat(seat.to_string()))?;
    let live = live_targets(store).await?;
    let holder = store
        .lease(&format!("seat:{seat}"))
        .await?
        .map(|l| l.preferred);
    judge(seat, &role.placement, to, &live, holder.as_deref())?;
    let now = store.now().await?;
    let req = MoveRequest {
        seat: seat.to_string(),
        to: to.to_string(),
        by: by.to_string(),
        reason: reason.trim().to_string(),
        requested_at: now,
        until: now.plus(MOVE_STANDS_FOR),
    };
    put(store, &req).await?;
    Ok(req)
}

async fn put(store: &dyn Store, req: &MoveRequest) -> Result<(), StoreError> {
    let body = bytes::Bytes::from(serde_json::to_vec(req).unwrap_or_default());
    let k = key(&req.seat);
    for _ in 0..5 {
        let res = match store.get(StateBucket::Handoffs, &k).await? {
            None => store
                .create(StateBucket::Handoffs, &k, body.clone())
                .await
                .map(|_| ()),
            Some(e) => store
                .update(StateBucket::Handoffs, &k, body.clone(), e.revision)
                .await
                .map(|_| ()),
        };
        match res {
            Ok(()) => return Ok(()),
            Err(KvError::Store(e)) => return Err(e),
            Err(_) => continue,
        }
    }
    Err(StoreError::Backend(
        "the move request kept changing under its write".into(),
    ))
}

/// Every standing request (expired ones are left out), with each record's
/// revision.
pub async fn standing(store: &dyn Store) -> Result<Vec<(MoveRequest, u64)>, StoreError> {
    let now = store.now().await?;
    Ok(store
        .entries(StateBucket::Handoffs, "move:")
        .await?
        .into_iter()
        .filter_map(|e| {
            serde_json::from_slice::<MoveRequest>(&e.value)
                .ok()
                .map(|r| (r, e.revision))
        })
        .filter(|(r, _)| r.stands(now))
        .collect())
}

/// The request is done (the target holds the seat): remove it, but only
/// the revision that was read — a request made again since stands.
pub async fn finish(store: &dyn Store, seat: &str, revision: u64) {
    let _ = store
        .delete(StateBucket::Handoffs, &key(seat), revision)
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PlacementConfig;

    fn t(id: &str, labels: &[&str], serving: bool) -> Target {
        Target {
            node_id: id.into(),
            labels: labels.iter().map(|s| s.to_string()).collect(),
            serving,
        }
    }

    #[test]
    fn a_move_is_blocked_with_its_reason_when_no_node_but_the_holder_would_take_it() {
        let t = |id: &str, labels: &[&str], serving: bool| Target {
            node_id: id.into(),
            labels: labels.iter().map(|l| l.to_string()).collect(),
            serving,
        };
        let any = crate::config::PlacementConfig::default();
        let gpu = crate::config::PlacementConfig {
            nodes: vec![],
            labels: vec!["gpu".into()],
        };
        let alone = [t("a", &[], true)];
        assert_eq!(
            move_blocked("s", &any, &alone, Some("a")).as_deref(),
            Some("no other node is live: a move needs a second node")
        );
        let two = [t("a", &["gpu"], true), t("b", &[], true)];
        assert_eq!(move_blocked("s", &any, &two, Some("a")), None);
        let blocked = move_blocked("s", &gpu, &two, Some("a")).unwrap();
        assert!(blocked.contains("its placement is"), "{blocked}");
        let draining = [t("a", &[], true), t("b", &[], false)];
        assert!(move_blocked("s", &any, &draining, Some("a")).is_some());
        // Nobody holds it: any serving node in the placement will do.
        assert_eq!(move_blocked("s", &any, &alone, None), None);
    }

    #[test]
    fn a_move_outside_the_placement_is_refused_naming_it() {
        let p = PlacementConfig {
            nodes: vec![],
            labels: vec!["gpu".into()],
        };
        let live = [t("a", &["gpu"], true), t("b", &[], true)];
        let e = judge("s", &p, "b", &live, Some("a")).unwrap_err();
        assert!(
            matches!(e, MoveError::OutsidePlacement { ref node, .. } if node == "b"),
            "{e}"
        );
        assert!(e.to_string().contains("labels gpu"), "{e}");
        assert!(judge("s", &p, "a", &live, None).is_ok());
    }

    #[test]
    fn a_move_to_an_unknown_draining_or_current_node_is_refused() {
        let p = PlacementConfig::default();
        let live = [t("a", &[], true), t("d", &[], false)];
        assert!(matches!(
            judge("s", &p, "zz", &live, None),
            Err(MoveError::UnknownNode(_))
        ));
        assert!(matches!(
            judge("s", &p, "d", &live, None),
            Err(MoveError::NotServing(_))
        ));
        assert!(matches!(
            judge("s", &p, "a", &live, Some("a")),
            Err(MoveError::AlreadyThere { .. })
        ));
    }

    #[test]
    fn a_request_stands_until_its_bound() {
        let r = MoveRequest {
            seat: "s".into(),
            to: "a".into(),
            by: "op".into(),
            reason: "r".into(),
            requested_at: StoreTime::from_unix_nanos(0),
            until: StoreTime::from_unix_nanos(10),
        };
        assert!(r.stands(StoreTime::from_unix_nanos(9)));
        assert!(!r.stands(StoreTime::from_unix_nanos(10)));
    }
}
