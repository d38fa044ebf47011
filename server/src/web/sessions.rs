//! Owns how sign-in sessions are kept: a [`SessionStore`] that keeps each
//! session under a hash of its cookie's id, never the id itself.
//!
//! The cookie's value is the session's only secret. A process that can read
//! the node's database (a backup, a stolen copy, a child the node's user
//! started) finds in `sessions.id` only SHA-256 digests, from which no
//! cookie can be made: a session cannot be stolen from the file.

use async_trait::async_trait;
use sha2::{Digest, Sha256};
use tower_sessions::session::{Id, Record};
use tower_sessions::session_store::{self, ExpiredDeletion, SessionStore};

/// A session store that keeps sessions under the hash of their id.
#[derive(Debug, Clone)]
pub struct HashedIds<S> {
    inner: S,
}

impl<S> HashedIds<S> {
    pub fn new(inner: S) -> Self {
        Self { inner }
    }
}

/// Pure: the id a session whose cookie carries `id` is kept under: the
/// first 128 bits of a domain-separated SHA-256 of it.
pub fn stored_id(id: &Id) -> Id {
    let mut h = Sha256::new();
    h.update(b"crewlet session id\0");
    h.update(id.0.to_le_bytes());
    let digest = h.finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    Id(i128::from_le_bytes(bytes))
}

fn kept(record: &Record) -> Record {
    Record {
        id: stored_id(&record.id),
        data: record.data.clone(),
        expiry_date: record.expiry_date,
    }
}

#[async_trait]
impl<S: SessionStore + Clone> SessionStore for HashedIds<S> {
    /// A new session under a fresh id no kept session's hash matches.
    async fn create(&self, record: &mut Record) -> session_store::Result<()> {
        while self.inner.load(&stored_id(&record.id)).await?.is_some() {
            record.id = Id::default();
        }
        self.inner.save(&kept(record)).await
    }

    async fn save(&self, record: &Record) -> session_store::Result<()> {
        self.inner.save(&kept(record)).await
    }

    /// The session kept under `id`'s hash, handed back under `id`.
    async fn load(&self, id: &Id) -> session_store::Result<Option<Record>> {
        Ok(self
            .inner
            .load(&stored_id(id))
            .await?
            .map(|record| Record { id: *id, ..record }))
    }

    async fn delete(&self, id: &Id) -> session_store::Result<()> {
        self.inner.delete(&stored_id(id)).await
    }
}

#[async_trait]
impl<S: ExpiredDeletion + Clone> ExpiredDeletion for HashedIds<S> {
    async fn delete_expired(&self) -> session_store::Result<()> {
        self.inner.delete_expired().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower_sessions::MemoryStore;

    fn record() -> Record {
        Record {
            id: Id::default(),
            data: Default::default(),
            expiry_date: time::OffsetDateTime::now_utc() + time::Duration::hours(1),
        }
    }

    #[test]
    fn a_stored_id_is_not_the_cookie_id_and_is_the_same_for_the_same_cookie() {
        let id = Id(42);
        assert_ne!(stored_id(&id), id);
        assert_eq!(stored_id(&id), stored_id(&Id(42)));
        assert_ne!(stored_id(&id), stored_id(&Id(43)));
    }

    #[tokio::test]
    async fn a_session_is_kept_under_its_hash_and_loaded_under_its_cookie_id() {
        let inner = MemoryStore::default();
        let store = HashedIds::new(inner.clone());
        let mut r = record();
        store.create(&mut r).await.unwrap();
        assert!(
            inner.load(&r.id).await.unwrap().is_none(),
            "kept under the cookie's id"
        );
        assert!(inner.load(&stored_id(&r.id)).await.unwrap().is_some());
        let loaded = store
            .load(&r.id)
            .await
            .unwrap()
            .expect("loaded by its cookie id");
        assert_eq!(loaded.id, r.id);
        // The stored id itself, as a cookie, opens nothing.
        assert!(store.load(&stored_id(&r.id)).await.unwrap().is_none());
        store.delete(&r.id).await.unwrap();
        assert!(inner.load(&stored_id(&r.id)).await.unwrap().is_none());
    }
}
