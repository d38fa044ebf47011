//! Company revisions: the active company (roles → seats) as a numbered
//! revision in the coordination store, and the activation pointer every
//! node follows.
//!
//! Keys in the config bucket (`crewlet_config`): `revision:{n}` holds a
//! revision (whole, or the manifest of its parts: [`stored`]), `active`
//! names the one in force. Applying writes the next revision, then moves
//! the pointer by compare-and-set; two applies racing each get their own
//! number and the pointer ends on one of them, never on a half-written
//! one. Nothing here decides placement.

mod stored;

pub use stored::{PART_BYTES, part_key};

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use stored::read;
use tokio::sync::watch;

use crate::config::{Config, RoleConfig};
use crate::coord::{Event as StoreEvent, KvError, StateBucket, Store, StoreError};
use crate::tasks::Tasks;

pub const ACTIVE_KEY: &str = "active";

pub fn revision_key(n: u64) -> String {
    format!("revision:{n}")
}

/// One revision of the company.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Company {
    pub revision: u64,
    pub name: String,
    /// The company's clock (`company.timezone`), UTC for a revision
    /// written before it was kept.
    #[serde(default = "utc")]
    pub timezone: String,
    pub roles: Vec<RoleConfig>,
    #[serde(default)]
    pub schedules: Vec<crate::config::ScheduleConfig>,
}

fn utc() -> String {
    "UTC".into()
}

impl Company {
    pub fn handles(&self) -> impl Iterator<Item = &str> {
        self.roles.iter().map(|r| r.handle.as_str())
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Pointer {
    revision: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum CompanyError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("revision {0} is unreadable: {1}")]
    Corrupt(u64, String),
    #[error("the activation pointer is unreadable: {0}")]
    BadPointer(String),
    #[error("another apply kept winning the race; try again")]
    Contended,
}

impl From<KvError> for CompanyError {
    fn from(e: KvError) -> Self {
        match e {
            KvError::Store(s) => CompanyError::Store(s),
            other => CompanyError::Store(StoreError::Backend(other.to_string())),
        }
    }
}

/// The active revision, if the fleet has one.
pub async fn active(store: &dyn Store) -> Result<Option<Company>, CompanyError> {
    let Some(p) = store.get(StateBucket::Config, ACTIVE_KEY).await? else {
        return Ok(None);
    };
    let pointer: Pointer =
        serde_json::from_slice(&p.value).map_err(|e| CompanyError::BadPointer(e.to_string()))?;
    read(store, pointer.revision).await.map(Some)
}

/// Write `name` + `roles` as the next revision and make it active.
pub async fn apply(
    store: &dyn Store,
    name: &str,
    roles: &[RoleConfig],
) -> Result<u64, CompanyError> {
    apply_with_schedules(store, name, roles, &[]).await
}

/// Write `name` + `roles` + `schedules` as the next revision (on UTC's
/// clock) and make it active.
pub async fn apply_with_schedules(
    store: &dyn Store,
    name: &str,
    roles: &[RoleConfig],
    schedules: &[crate::config::ScheduleConfig],
) -> Result<u64, CompanyError> {
    let head = crate::config::CompanySection {
        name: name.to_string(),
        timezone: utc(),
    };
    apply_company(store, &head, roles, schedules).await
}

/// Write a company file's `[company]`, roles and schedules as the next
/// revision and make it active.
pub async fn apply_company(
    store: &dyn Store,
    head: &crate::config::CompanySection,
    roles: &[RoleConfig],
    schedules: &[crate::config::ScheduleConfig],
) -> Result<u64, CompanyError> {
    let company = Company {
        revision: 0,
        name: head.name.clone(),
        timezone: head.timezone.clone(),
        roles: roles.to_vec(),
        schedules: schedules.to_vec(),
    };
    let parts = stored::write_parts(store, &company).await?;
    for _ in 0..16 {
        let current = store.get(StateBucket::Config, ACTIVE_KEY).await?;
        let at = match &current {
            Some(e) => {
                serde_json::from_slice::<Pointer>(&e.value)
                    .map_err(|err| CompanyError::BadPointer(err.to_string()))?
                    .revision
            }
            None => 0,
        };
        // Find a free number (a racing apply may have taken this one).
        let mut n = at + 1;
        loop {
            let body = stored::revision_value(&company, n, parts.as_ref());
            match store
                .create(StateBucket::Config, &revision_key(n), body)
                .await
            {
                Ok(_) => break,
                Err(KvError::AlreadyExists) => n += 1,
                Err(e) => return Err(e.into()),
            }
        }
        let pointer = Bytes::from(serde_json::to_vec(&Pointer { revision: n }).unwrap_or_default());
        let moved = match &current {
            Some(e) => {
                store
                    .update(StateBucket::Config, ACTIVE_KEY, pointer, e.revision)
                    .await
            }
            None => store.create(StateBucket::Config, ACTIVE_KEY, pointer).await,
        };
        match moved {
            Ok(_) => return Ok(n),
            Err(KvError::AlreadyExists | KvError::WrongRevision) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(CompanyError::Contended)
}

/// At boot: the fleet's active revision, or — when there is none — this
/// node's company file, written as revision 1.
pub async fn boot(store: &dyn Store, config: &Config) -> Result<Company, CompanyError> {
    if let Some(c) = active(store).await? {
        if c.roles != config.roles {
            tracing::info!(
                revision = c.revision,
                "following the fleet's active company revision; this node's [[roles]] differ (use `crewlet apply` to change the company)"
            );
        }
        return Ok(c);
    }
    match apply_company(store, &config.company, &config.roles, &config.schedules).await {
        Ok(_) => {}
        Err(e) => return Err(e),
    }
    active(store)
        .await?
        .ok_or_else(|| CompanyError::BadPointer("vanished after the first apply".into()))
}

/// Follow the activation pointer: the returned receiver always holds the
/// active revision. The watch task is owned by `tasks`; it re-subscribes
/// after a store error.
pub fn follow(
    store: std::sync::Arc<dyn Store>,
    first: Company,
    tasks: &Tasks,
) -> watch::Receiver<Company> {
    let (tx, rx) = watch::channel(first);
    tasks.spawn("company-follow", async move {
        loop {
            match store.watch(StateBucket::Config, ACTIVE_KEY).await {
                Ok(mut events) => {
                    while let Some(ev) = events.next().await {
                        match ev {
                            Ok(StoreEvent::Put(e)) if e.key == ACTIVE_KEY => {
                                let Ok(p) = serde_json::from_slice::<Pointer>(&e.value) else {
                                    tracing::warn!("unreadable activation pointer; keeping the current revision");
                                    continue;
                                };
                                if p.revision == tx.borrow().revision {
                                    continue;
                                }
                                match read(&*store, p.revision).await {
                                    Ok(c) => {
                                        let _ = tx.send(c);
                                    }
                                    Err(err) => tracing::warn!(error = %err, "cannot read the new company revision"),
                                }
                            }
                            Ok(_) => {}
                            Err(err) => {
                                tracing::warn!(error = %err, "the company watch failed; re-subscribing");
                                break;
                            }
                        }
                    }
                }
                Err(err) => tracing::warn!(error = %err, "cannot watch the activation pointer"),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    rx
}

/// Does the change from `old` to `new` call for an early sweep? A node's
/// first company, a role added or removed, a seat's placement moved.
pub fn wants_early_sweep(old: Option<&Company>, new: &Company) -> bool {
    let Some(old) = old else { return true };
    let before: std::collections::BTreeMap<&str, &crate::config::PlacementConfig> = old
        .roles
        .iter()
        .map(|r| (r.handle.as_str(), &r.placement))
        .collect();
    let after: std::collections::BTreeMap<&str, &crate::config::PlacementConfig> = new
        .roles
        .iter()
        .map(|r| (r.handle.as_str(), &r.placement))
        .collect();
    before != after
}
