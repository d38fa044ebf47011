//! The mailbox registry (the removed seat): every seat is recorded in
//! `crewlet_mailboxes` before its subscriptions are created, so a seat
//! later removed from the company can be found and retired (the retirement
//! itself is the maintenance duty's, `duty::mailboxes`).

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::coord::{KvError, StateBucket, Store};
use crate::events::{Event, EventBus};

/// How long a retirement may take before a node adding the seat back takes
/// its record over (after twice this).
pub const RETIREMENT_BUDGET: Duration = Duration::from_secs(30);
/// A seat's record in the registry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MailboxRecord {
    pub handle: String,
    /// Store clock, unix milliseconds.
    pub registered_at_ms: i64,
    /// When a sweep first saw the seat missing from the active revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub absent_since_ms: Option<i64>,
    /// A retirement in flight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retiring: Option<RetirementMark>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetirementMark {
    /// The owner the retirement claimed the seat's lease under.
    pub by: String,
    pub at_ms: i64,
}

pub(crate) fn encode(r: &MailboxRecord) -> Bytes {
    Bytes::from(serde_json::to_vec(r).unwrap_or_default())
}

pub(crate) async fn now_ms(store: &dyn Store) -> Result<i64, crate::coord::StoreError> {
    store.now().await.map(|t| t.unix_nanos() / 1_000_000)
}

/// Record `handles` in the registry before their subscriptions are
/// created: one listing, then a create for each seat with no record. A
/// seat whose record carries a retirement mark waits for the mark to clear
/// (the retirement finishing) and takes the record over after twice
/// `budget`. A registration that fails is reported
/// (`seat_mailbox_unregistered`) and the mailbox is created anyway.
pub async fn register(store: &dyn Store, handles: &[String], events: &EventBus, budget: Duration) {
    let existing: BTreeMap<String, MailboxRecord> =
        match store.entries(StateBucket::Mailboxes, "").await {
            Ok(es) => es
                .into_iter()
                .filter_map(|e| {
                    serde_json::from_slice::<MailboxRecord>(&e.value)
                        .ok()
                        .map(|r| (e.key, r))
                })
                .collect(),
            Err(e) => {
                for h in handles {
                    events.emit(Event::SeatMailboxUnregistered {
                        seat: h.clone(),
                        error: e.to_string(),
                    });
                }
                return;
            }
        };
    for h in handles {
        match existing.get(h) {
            Some(r) if r.retiring.is_some() => wait_out_retirement(store, h, events, budget).await,
            Some(_) => {}
            None => register_one(store, h, events).await,
        }
    }
}

pub(crate) async fn register_one(store: &dyn Store, handle: &str, events: &EventBus) {
    let now = match now_ms(store).await {
        Ok(n) => n,
        Err(e) => {
            events.emit(Event::SeatMailboxUnregistered {
                seat: handle.to_string(),
                error: e.to_string(),
            });
            return;
        }
    };
    let rec = MailboxRecord {
        handle: handle.to_string(),
        registered_at_ms: now,
        absent_since_ms: None,
        retiring: None,
    };
    match store
        .create(StateBucket::Mailboxes, handle, encode(&rec))
        .await
    {
        Ok(_) | Err(KvError::AlreadyExists) => {}
        Err(e) => events.emit(Event::SeatMailboxUnregistered {
            seat: handle.to_string(),
            error: e.to_string(),
        }),
    }
}

/// A seat added back while its old mailbox is being retired: wait for the
/// retirement to finish (so its delete cannot land on the new inbox), and
/// take the record over when it has not finished within twice `budget`.
pub async fn wait_out_retirement(
    store: &dyn Store,
    handle: &str,
    events: &EventBus,
    budget: Duration,
) {
    let deadline = tokio::time::Instant::now() + budget * 2;
    loop {
        match store.get(StateBucket::Mailboxes, handle).await {
            Ok(None) => {
                register_one(store, handle, events).await;
                return;
            }
            Ok(Some(e)) => {
                let rec = serde_json::from_slice::<MailboxRecord>(&e.value).ok();
                match rec {
                    Some(r) if r.retiring.is_some() => {
                        if tokio::time::Instant::now() >= deadline {
                            let taken = MailboxRecord {
                                absent_since_ms: None,
                                retiring: None,
                                ..r
                            };
                            match store
                                .update(StateBucket::Mailboxes, handle, encode(&taken), e.revision)
                                .await
                            {
                                Ok(_) => {
                                    events.emit(Event::SeatMailboxRetirementTakenOver {
                                        seat: handle.to_string(),
                                    });
                                    return;
                                }
                                Err(KvError::WrongRevision) => continue,
                                Err(err) => {
                                    events.emit(Event::SeatMailboxUnregistered {
                                        seat: handle.to_string(),
                                        error: err.to_string(),
                                    });
                                    return;
                                }
                            }
                        }
                    }
                    // The mark cleared (the retirement gave up, or
                    // someone rewrote it): the record stands.
                    _ => return,
                }
            }
            Err(e) => {
                tracing::warn!(seat = handle, error = %e, "cannot read the seat's mailbox record while a retirement is marked; waiting");
                if tokio::time::Instant::now() >= deadline {
                    events.emit(Event::SeatMailboxUnregistered {
                        seat: handle.to_string(),
                        error: e.to_string(),
                    });
                    return;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
