//! A coordination store whose run records cannot be read (listing
//! `crewlet_runs` fails) while a test says so, in front of a fleet's real
//! store, and a turn-fleet node built over it. The run suite uses it for a
//! seat whose interrupted runs cannot be recovered in the acquire hook
//! (spec § Establishing a seat: handed back voluntarily, `unprepared`).
//!
//! Included by path (`#[path = "support/run_faults.rs"]`) from the suites
//! that use it, next to `mod support;`.

#![allow(dead_code)]

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use async_trait::async_trait;
use crewlet::config::RoleConfig;
use crewlet::coord::{Lease, StateBucket, Store, StoreError};

use crate::support::faulty::{Call, Faults, Faulty};
use crate::support::turnfleet::{Fleet, Node};

/// In front of the fleet's store: its run records cannot be listed while
/// [`RunsUnreadable::unreadable`] says so. It counts the listings it failed
/// and notes every lease this node gave back (released, not left to lapse).
pub struct Unreadable {
    unreadable: AtomicBool,
    failed: AtomicUsize,
    released: Mutex<Vec<(String, u64)>>,
}

/// The fleet's store whose run records cannot be listed on request.
pub type RunsUnreadable = Faulty<Unreadable>;

impl Faulty<Unreadable> {
    pub fn new(inner: Arc<dyn Store>, unreadable: bool) -> Arc<RunsUnreadable> {
        Faulty::wrap(
            inner,
            Unreadable {
                unreadable: AtomicBool::new(unreadable),
                failed: AtomicUsize::new(0),
                released: Mutex::new(Vec::new()),
            },
        )
    }
}

impl Unreadable {
    /// The run records can be read again.
    pub fn heal(&self) {
        self.unreadable.store(false, Ordering::SeqCst);
    }

    /// How many listings of the run records failed.
    pub fn failed(&self) -> usize {
        self.failed.load(Ordering::SeqCst)
    }

    /// The leases (resource, epoch) this store released on request.
    pub fn released(&self) -> Vec<(String, u64)> {
        self.released
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

#[async_trait]
impl Faults for Unreadable {
    async fn before(&self, call: Call<'_>) -> Result<(), StoreError> {
        if matches!(call, Call::Entries(StateBucket::Runs, _))
            && self.unreadable.load(Ordering::SeqCst)
        {
            self.failed.fetch_add(1, Ordering::SeqCst);
            return Err(StoreError::Unavailable(
                "injected: the run records cannot be read".into(),
            ));
        }
        Ok(())
    }

    fn released(&self, lease: &Lease) {
        self.released
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((lease.resource.clone(), lease.epoch));
    }
}

/// Start node `id` (as [`Fleet::node`] does) over its fleet store wrapped
/// in [`RunsUnreadable`] (unreadable from the start when `unreadable`); the
/// first node writes `roles` as the company. The node's `store` is the
/// wrapped one.
pub async fn node_over(
    f: &Fleet,
    id: &str,
    roles: &[RoleConfig],
    unreadable: bool,
) -> (Node, Arc<RunsUnreadable>) {
    let mut wrapped = None;
    let node = f
        .node_over_store(
            id,
            roles,
            |real| {
                let w = RunsUnreadable::new(real, unreadable);
                wrapped = Some(w.clone());
                w
            },
            |turns| turns,
        )
        .await;
    (node, wrapped.expect("the store was wrapped"))
}
