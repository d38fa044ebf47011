//! The person-ordered node ranking (handoff § 8, "Overriding the order"):
//! which live node comes first when the fleet has a choice.
//!
//! It owns one record in the coordination store, `node-order` in the config
//! bucket (`crewlet_config`): `{"nodes": [ids, top priority first],
//! "set_by": person, "set_at": RFC 3339}`. Every node reads that one record,
//! so every node ranks the fleet the same way — a node never acts on a
//! private order (two private orders are two drivers, each top of its own
//! list). Saving is compare-and-set against the revision the person read.
//!
//! The saved order is older than the fleet it ranks: [`effective_order`]
//! (pure) turns it into a total order over the nodes present now — keep the
//! saved order for nodes still present, append the ones it has never seen in
//! first-seen order, drop the absent ones, and fall back to the first-seen
//! order when nothing is left. First seen is when a node id first held a
//! presence lease, kept once per id (`node-seen:{id}` in the config bucket,
//! written create-only): a restarted node keeps its place, where its new
//! presence lease's `acquired_at` would put it last.
//!
//! It must never decide anything itself (the sweep reads [`effective`] and
//! places seats), never write anything but the one record, and never read a
//! clock other than the store's.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::coord::{KvError, StateBucket, Store, StoreError, StoreTime};

/// The record's key in the config bucket.
pub const KEY: &str = "node-order";

/// The prefix of the first-seen records (`node-seen:{id}`).
pub const SEEN_PREFIX: &str = "node-seen:";

/// The saved order as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeOrder {
    /// Node ids, top priority first.
    pub nodes: Vec<String>,
    /// The person who saved it.
    pub set_by: String,
    /// When, RFC 3339 on the store's clock.
    pub set_at: String,
}

/// Why the order could not be read or saved.
#[derive(Debug, thiserror::Error)]
pub enum RankingError {
    /// The record changed since it was read (or was saved by somebody else
    /// first): nothing was written.
    #[error(
        "the node order was saved by somebody else since you read it (you read {}, it is at {}); reload it and save again",
        revision_words(*expected),
        revision_words(*current)
    )]
    Conflict {
        expected: Option<u64>,
        current: Option<u64>,
    },
    #[error("node {0:?} appears more than once in the order; list each node once")]
    Duplicate(String),
    #[error("entry {0} of the order is an empty node id; every entry must name a node")]
    EmptyNode(usize),
    #[error("the saved node order cannot be read ({0}); save a new one to replace it")]
    Corrupt(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn revision_words(r: Option<u64>) -> String {
    match r {
        Some(n) => format!("revision {n}"),
        None => "no saved order".into(),
    }
}

/// Pure: the order every node ranks the live fleet by.
///
/// `order` is the saved order (top first); `present` the live nodes with
/// when each was first seen (its presence lease's `acquired_at`). Nodes of
/// `order` still present keep their places; present nodes `order` never
/// named follow, earliest first-seen first (ties by node id); absent nodes
/// are dropped. An empty result falls back to the first-seen order. The
/// answer names every present node exactly once.
pub fn effective_order(order: &[String], present: &[(String, StoreTime)]) -> Vec<String> {
    // First-seen order over the present set; a node listed twice counts
    // from its earliest sighting.
    let mut seen: Vec<(StoreTime, &str)> = present.iter().map(|(n, t)| (*t, n.as_str())).collect();
    seen.sort();
    let mut once = BTreeSet::new();
    let first_seen: Vec<&str> = seen
        .into_iter()
        .map(|(_, n)| n)
        .filter(|n| once.insert(*n))
        .collect();

    let mut placed = BTreeSet::new();
    let kept: Vec<&str> = order
        .iter()
        .map(String::as_str)
        .filter(|n| once.contains(n) && placed.insert(*n))
        .collect();
    let appended = first_seen.iter().copied().filter(|n| !placed.contains(n));
    let result: Vec<String> = kept
        .iter()
        .copied()
        .chain(appended)
        .map(str::to_string)
        .collect();
    if result.is_empty() {
        first_seen.into_iter().map(str::to_string).collect()
    } else {
        result
    }
}

/// Pure: why `nodes` may not be saved as an order, if it may not.
pub fn check(nodes: &[String]) -> Result<(), RankingError> {
    let mut seen = BTreeSet::new();
    for (i, n) in nodes.iter().enumerate() {
        if n.trim().is_empty() {
            return Err(RankingError::EmptyNode(i + 1));
        }
        if !seen.insert(n.as_str()) {
            return Err(RankingError::Duplicate(n.clone()));
        }
    }
    Ok(())
}

/// The saved order and its revision; `None` when nobody ever saved one.
pub async fn read(store: &dyn Store) -> Result<Option<(NodeOrder, u64)>, RankingError> {
    let Some(entry) = store.get(StateBucket::Config, KEY).await? else {
        return Ok(None);
    };
    let order: NodeOrder =
        serde_json::from_slice(&entry.value).map_err(|e| RankingError::Corrupt(e.to_string()))?;
    Ok(Some((order, entry.revision)))
}

/// Save `nodes` (top first) as the fleet's order, by `by`, against the
/// revision the person read (`None`: they read no saved order). Refused
/// with [`RankingError::Conflict`] when the record has moved since, and
/// with the entry named when a node id is empty or listed twice. Returns
/// the new revision.
pub async fn save(
    store: &dyn Store,
    nodes: Vec<String>,
    by: &str,
    expected: Option<u64>,
) -> Result<u64, RankingError> {
    check(&nodes)?;
    let now = store.now().await?;
    let record = NodeOrder {
        nodes,
        set_by: by.to_string(),
        set_at: rfc3339_seconds(now),
    };
    // A record of strings cannot fail to serialise.
    let body = bytes::Bytes::from(serde_json::to_vec(&record).unwrap_or_default());
    let written = match expected {
        None => store.create(StateBucket::Config, KEY, body).await,
        Some(rev) => store.update(StateBucket::Config, KEY, body, rev).await,
    };
    match written {
        Ok(rev) => Ok(rev),
        Err(KvError::AlreadyExists | KvError::WrongRevision) => {
            let current = store.get(StateBucket::Config, KEY).await?;
            Err(RankingError::Conflict {
                expected,
                current: current.map(|e| e.revision),
            })
        }
        Err(KvError::Store(e)) => Err(e.into()),
    }
}

/// The order every node ranks the live fleet by now: the saved order (none
/// saved: empty) over the live presence leases, by [`effective_order`].
pub async fn effective(store: &dyn Store) -> Result<Vec<String>, RankingError> {
    let saved = read(store).await?.map(|(o, _)| o.nodes).unwrap_or_default();
    let present = present(store).await?;
    Ok(effective_order(&saved, &present))
}

/// The live nodes with when each was first seen (its record, else its
/// presence lease's `acquired_at`).
pub async fn present(store: &dyn Store) -> Result<Vec<(String, StoreTime)>, StoreError> {
    let live: Vec<(String, StoreTime)> = store
        .list("node:")
        .await?
        .into_iter()
        .filter_map(|l| {
            l.resource
                .strip_prefix("node:")
                .map(|id| (id.to_string(), l.acquired_at))
        })
        .collect();
    Ok(first_seen_kept(live, &seen(store).await?))
}

/// Keep `at` as when node `id` was first seen, unless a time is kept for it
/// already (create-only: the first writer's time stands). A presence
/// holder calls it with its lease's `acquired_at`.
pub async fn remember(store: &dyn Store, id: &str, at: StoreTime) -> Result<(), StoreError> {
    let value = serde_json::to_vec(&at.unix_nanos()).unwrap_or_default();
    match store
        .create(
            StateBucket::Config,
            &format!("{SEEN_PREFIX}{id}"),
            value.into(),
        )
        .await
    {
        Ok(_) | Err(KvError::AlreadyExists) => Ok(()),
        Err(KvError::WrongRevision) => Ok(()),
        Err(KvError::Store(e)) => Err(e),
    }
}

/// Every node id's kept first-seen time.
pub async fn seen(
    store: &dyn Store,
) -> Result<std::collections::BTreeMap<String, StoreTime>, StoreError> {
    Ok(store
        .entries(StateBucket::Config, SEEN_PREFIX)
        .await?
        .into_iter()
        .filter_map(|e| {
            let id = e.key.strip_prefix(SEEN_PREFIX)?.to_string();
            let nanos: i64 = serde_json::from_slice(&e.value).ok()?;
            Some((id, StoreTime::from_unix_nanos(nanos)))
        })
        .collect())
}

/// Pure: `live` (node id, presence `acquired_at`) with each id's kept
/// first-seen time where there is one.
pub fn first_seen_kept(
    live: Vec<(String, StoreTime)>,
    kept: &std::collections::BTreeMap<String, StoreTime>,
) -> Vec<(String, StoreTime)> {
    live.into_iter()
        .map(|(id, at)| {
            let at = kept.get(&id).copied().unwrap_or(at);
            (id, at)
        })
        .collect()
}

/// RFC 3339 in whole seconds (UTC) of a store time.
fn rfc3339_seconds(t: StoreTime) -> String {
    t.to_offset()
        .and_then(|o| o.replace_nanosecond(0).ok())
        .and_then(|o| {
            o.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| t.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    fn at(n: i64) -> StoreTime {
        StoreTime::from_unix_nanos(n)
    }

    fn p(v: &[(&str, i64)]) -> Vec<(String, StoreTime)> {
        v.iter().map(|(n, t)| (n.to_string(), at(*t))).collect()
    }

    #[test]
    fn the_saved_order_is_kept_for_nodes_still_present() {
        let present = p(&[("a", 1), ("b", 2), ("c", 3)]);
        assert_eq!(
            effective_order(&s(&["c", "a", "b"]), &present),
            s(&["c", "a", "b"])
        );
    }

    #[test]
    fn nodes_the_order_never_saw_are_appended_in_first_seen_order() {
        let present = p(&[("late", 30), ("b", 2), ("early", 10), ("a", 1)]);
        assert_eq!(
            effective_order(&s(&["b", "a"]), &present),
            s(&["b", "a", "early", "late"])
        );
    }

    #[test]
    fn newcomers_seen_at_the_same_moment_are_ordered_by_node_id() {
        let present = p(&[("z", 5), ("m", 5), ("a", 9)]);
        assert_eq!(effective_order(&[], &present), s(&["m", "z", "a"]));
        assert_eq!(effective_order(&s(&["a"]), &present), s(&["a", "m", "z"]));
    }

    #[test]
    fn absent_nodes_are_dropped() {
        let present = p(&[("a", 1), ("c", 3)]);
        assert_eq!(
            effective_order(&s(&["gone", "c", "left", "a"]), &present),
            s(&["c", "a"])
        );
    }

    #[test]
    fn an_order_that_names_nobody_present_falls_back_to_first_seen() {
        let present = p(&[("b", 2), ("a", 7)]);
        assert_eq!(effective_order(&s(&["x", "y"]), &present), s(&["b", "a"]));
        assert_eq!(effective_order(&[], &present), s(&["b", "a"]));
    }

    #[test]
    fn nobody_present_is_an_empty_order() {
        assert!(effective_order(&s(&["a", "b"]), &[]).is_empty());
        assert!(effective_order(&[], &[]).is_empty());
    }

    #[test]
    fn a_node_listed_twice_counts_once_at_its_first_place_and_earliest_sighting() {
        let present = p(&[("a", 5), ("b", 3), ("a", 1)]);
        assert_eq!(
            effective_order(&s(&["b", "a", "b"]), &present),
            s(&["b", "a"])
        );
        // Unsaved, `a` counts from its earliest sighting (1), before `b` (3).
        assert_eq!(effective_order(&[], &present), s(&["a", "b"]));
    }

    /// A small deterministic generator (xorshift), so the loop below is the
    /// same on every run.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.0 = x;
            x
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    #[test]
    fn every_result_is_a_permutation_of_the_present_nodes_keeping_the_saved_relative_order() {
        let ids: Vec<String> = (0..8).map(|i| format!("n{i}")).collect();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..5_000 {
            let order: Vec<String> = (0..rng.below(10))
                .map(|_| ids[rng.below(8) as usize].clone())
                .collect();
            let mut present: Vec<(String, StoreTime)> = Vec::new();
            for n in &ids {
                if rng.below(3) != 0 {
                    present.push((n.clone(), at(rng.below(4) as i64)));
                }
            }
            let got = effective_order(&order, &present);

            // A permutation of the present set.
            let mut sorted = got.clone();
            sorted.sort();
            let mut want: Vec<String> = present.iter().map(|(n, _)| n.clone()).collect();
            want.sort();
            want.dedup();
            assert_eq!(sorted, want, "order {order:?}, present {present:?}");

            // The saved nodes still present come first, in the saved order.
            let mut kept: Vec<String> = Vec::new();
            for n in &order {
                if want.contains(n) && !kept.contains(n) {
                    kept.push(n.clone());
                }
            }
            assert_eq!(got[..kept.len()], kept[..], "order {order:?}");

            // The rest are in first-seen order (ties by id).
            let key = |n: &String| {
                let t = present
                    .iter()
                    .filter(|(m, _)| m == n)
                    .map(|(_, t)| *t)
                    .min();
                (t, n.clone())
            };
            let rest = &got[kept.len()..];
            assert!(
                rest.windows(2).all(|w| key(&w[0]) < key(&w[1])),
                "order {order:?}, present {present:?}, got {got:?}"
            );

            // The same inputs give the same answer on every node.
            let mut shuffled = present.clone();
            shuffled.reverse();
            assert_eq!(effective_order(&order, &shuffled), got);
        }
    }

    #[test]
    fn an_empty_or_repeated_node_id_is_refused_naming_it() {
        assert!(check(&s(&["a", "b"])).is_ok());
        assert!(check(&[]).is_ok());
        let e = check(&s(&["a", "b", "a"])).unwrap_err();
        assert!(
            matches!(e, RankingError::Duplicate(ref n) if n == "a"),
            "{e}"
        );
        assert!(e.to_string().contains("\"a\""), "{e}");
        let e = check(&s(&["a", " "])).unwrap_err();
        assert!(matches!(e, RankingError::EmptyNode(2)), "{e}");
    }

    #[test]
    fn a_conflict_says_to_reload() {
        let e = RankingError::Conflict {
            expected: Some(3),
            current: Some(5),
        };
        let text = e.to_string();
        assert!(text.contains("reload"), "{text}");
        assert!(
            text.contains("revision 3") && text.contains("revision 5"),
            "{text}"
        );
    }
}
