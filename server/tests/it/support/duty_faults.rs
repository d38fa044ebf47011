//! A coordination store that fails (or never answers) the reads and
//! writes a test names, in front of a fleet's real store, and a turn-fleet
//! node built over it. The duty suites use it for the store errors and
//! timeouts the sweep and the registration must survive (spec § The
//! removed seat: unknown is never absent; a registration that fails still
//! creates the mailbox).
//!
//! Included by path (`#[path = "support/duty_faults.rs"]`) from the suites
//! that use it, next to `mod support;`.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use crewlet::config::RoleConfig;
use crewlet::coord::{StateBucket, Store, StoreError};
use crewlet::queue::{
    Attachment, DeadLetter, Handler, Queue, QueueError, SubscriptionInfo, SubscriptionSpec,
};
use tokio::sync::watch;

use crate::support::faulty::{Call, Faults, Faulty};
use crate::support::turnfleet::{Fleet, Node};

/// One read or write the store fails.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// `get` of this key in this bucket errors.
    Get(StateBucket, String),
    /// `entries` of this bucket errors.
    Entries(StateBucket),
    /// `lease` of this resource times out.
    Lease(String),
    /// `create` of this key in this bucket errors.
    Create(StateBucket, String),
    /// `entries` of this bucket never answers while the fault stands.
    HangEntries(StateBucket),
    /// A claim of this resource errors.
    Claim(String),
    /// A renewal of this resource cannot say (`Renewal::Unknown`).
    Renew(String),
    /// A claim of this resource waits while the fault stands, then goes
    /// through (a claim in flight).
    HoldClaim(String),
}

/// The [`Fault`]s standing in front of a fleet's store. A fault stands
/// until [`DutyFaults::heal`]; every call it touched is counted in
/// [`DutyFaults::hits`], so a test can prove the fault was reached.
pub struct DutyFaults {
    faults: watch::Sender<Vec<Fault>>,
    hits: Mutex<Vec<Fault>>,
    /// Every `get` asked of the store, faulted or not.
    gets: Mutex<Vec<(StateBucket, String)>>,
}

/// The fleet's store with [`Fault`]s in front of it.
pub type FaultyStore = Faulty<DutyFaults>;

impl Faulty<DutyFaults> {
    pub fn new(inner: Arc<dyn Store>, faults: &[Fault]) -> Arc<FaultyStore> {
        Faulty::wrap(
            inner,
            DutyFaults {
                faults: watch::Sender::new(faults.to_vec()),
                hits: Mutex::new(Vec::new()),
                gets: Mutex::new(Vec::new()),
            },
        )
    }
}

impl DutyFaults {
    /// Every fault stops standing (a hung call answers).
    pub fn heal(&self) {
        self.faults.send_replace(Vec::new());
    }

    /// `faults` stand from now on, instead of the ones that did.
    pub fn set(&self, faults: &[Fault]) {
        self.faults.send_replace(faults.to_vec());
    }

    /// How often `f` failed (or hung) a call.
    pub fn hits(&self, f: &Fault) -> usize {
        self.hits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|h| *h == f)
            .count()
    }

    /// How often `key` of `bucket` was read (`get`) through this store.
    pub fn gets(&self, bucket: StateBucket, key: &str) -> usize {
        self.gets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(b, k)| *b == bucket && k == key)
            .count()
    }

    fn stands(&self, f: &Fault) -> bool {
        let on = self.faults.borrow().contains(f);
        if on {
            self.hits
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(f.clone());
        }
        on
    }

    fn injected(f: &Fault) -> StoreError {
        StoreError::Unavailable(format!("injected: {f:?}"))
    }

    /// Fail with `f`'s error when it stands.
    fn fail(&self, f: Fault, error: impl FnOnce(&Fault) -> StoreError) -> Result<(), StoreError> {
        if self.stands(&f) {
            return Err(error(&f));
        }
        Ok(())
    }

    /// Wait while `f` stands.
    async fn hold(&self, f: Fault) {
        if self.stands(&f) {
            let mut rx = self.faults.subscribe();
            let _ = rx.wait_for(|fs| !fs.contains(&f)).await;
        }
    }
}

fn timeout(_: &Fault) -> StoreError {
    StoreError::Timeout(Duration::from_millis(2000))
}

#[async_trait]
impl Faults for DutyFaults {
    async fn before(&self, call: Call<'_>) -> Result<(), StoreError> {
        match call {
            Call::Claim(r) => {
                self.fail(Fault::Claim(r.to_string()), Self::injected)?;
                self.hold(Fault::HoldClaim(r.to_string())).await;
                Ok(())
            }
            Call::Renew(r) => self.fail(Fault::Renew(r.to_string()), timeout),
            Call::Lease(r) => self.fail(Fault::Lease(r.to_string()), timeout),
            Call::Get(b, k) => {
                self.gets
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((b, k.to_string()));
                self.fail(Fault::Get(b, k.to_string()), Self::injected)
            }
            Call::Create(b, k) => self.fail(Fault::Create(b, k.to_string()), Self::injected),
            Call::Entries(b, _) => {
                self.fail(Fault::Entries(b), Self::injected)?;
                self.hold(Fault::HangEntries(b)).await;
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

/// Start node `id` (as [`Fleet::node`] does) over its fleet store wrapped
/// in `faults`; the first node writes `roles` as the company. The node's
/// `store` is the faulty one.
pub async fn node_over_faults(
    f: &Fleet,
    id: &str,
    roles: &[RoleConfig],
    faults: &[Fault],
) -> (Node, Arc<FaultyStore>) {
    let mut faulty = None;
    let node = f
        .node_over_store(
            id,
            roles,
            |real| {
                let w = FaultyStore::new(real, faults);
                faulty = Some(w.clone());
                w
            },
            |turns| turns,
        )
        .await;
    (node, faulty.expect("the store was wrapped"))
}

/// The fleet's queue, with the delete of one subscription held: the delete
/// waits (before it reaches the broker) until [`PausingQueue::go`], and
/// [`PausingQueue::entered`] says it is waiting. What a retirement looks
/// like to a node adding the seat back in the middle of it.
pub struct PausingQueue {
    inner: Arc<dyn Queue>,
    name: String,
    entered: watch::Sender<bool>,
    go: watch::Sender<bool>,
}

impl PausingQueue {
    pub fn new(inner: Arc<dyn Queue>, name: &str) -> Arc<PausingQueue> {
        Arc::new(PausingQueue {
            inner,
            name: name.to_string(),
            entered: watch::Sender::new(false),
            go: watch::Sender::new(false),
        })
    }

    /// Whether the held delete has begun waiting.
    pub fn entered(&self) -> bool {
        *self.entered.borrow()
    }

    /// Let the held delete (and every later one) through.
    pub fn go(&self) {
        self.go.send_replace(true);
    }
}

#[async_trait]
impl Queue for PausingQueue {
    async fn ensure_subscription(&self, spec: &SubscriptionSpec) -> Result<(), QueueError> {
        self.inner.ensure_subscription(spec).await
    }
    async fn delete_subscription(&self, name: &str) -> Result<bool, QueueError> {
        if name == self.name {
            self.entered.send_replace(true);
            let mut go = self.go.subscribe();
            let _ = go.wait_for(|g| *g).await;
        }
        self.inner.delete_subscription(name).await
    }
    async fn list_subscriptions(&self) -> Result<Vec<SubscriptionInfo>, QueueError> {
        self.inner.list_subscriptions().await
    }
    async fn publish(
        &self,
        subject: &str,
        msg_id: Option<&str>,
        payload: Bytes,
    ) -> Result<bool, QueueError> {
        self.inner.publish(subject, msg_id, payload).await
    }
    async fn attach(
        &self,
        name: &str,
        holds: &[&str],
        handler: Arc<dyn Handler>,
    ) -> Result<Attachment, QueueError> {
        self.inner.attach(name, holds, handler).await
    }
    async fn pending(&self, name: &str) -> Result<u64, QueueError> {
        self.inner.pending(name).await
    }
    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, QueueError> {
        self.inner.dead_letters(limit).await
    }
    async fn dead_letter_count(&self) -> Result<u64, QueueError> {
        self.inner.dead_letter_count().await
    }
    async fn find_dead_letter(&self, id: u64) -> Result<Option<DeadLetter>, QueueError> {
        self.inner.find_dead_letter(id).await
    }
    async fn discard_dead_letter(&self, id: u64) -> Result<bool, QueueError> {
        self.inner.discard_dead_letter(id).await
    }
}
