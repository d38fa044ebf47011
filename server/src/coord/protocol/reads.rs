//! Reads: the scans and watches the live view, `list` and the state
//! buckets are built on.

use std::time::Duration;

use futures::StreamExt;

use crate::coord::kv::{self, Backend, BucketId, RawEntry, RawEvent, RawEventStream};
use crate::coord::lease::Lease;
use crate::coord::{Entry, StoreError};

use super::{Coordinator, HoldPoint, RECHECK, scope_of};

impl<B: Backend> Coordinator<B> {
    /// Every key's current state (a value or a removal marker) under
    /// `prefix`, read level with the bucket's last write under its scope.
    ///
    /// The watch delivers each key's last message in revision order, then
    /// what is written after. A key written again after the last revision
    /// was read (or while the watch delivers) is delivered only at its new
    /// revision, past that last one: so on reaching the last revision read
    /// the scan reads it once more and reads on to that. Stopping at the
    /// first instead once missed a live node's presence renewed a moment
    /// after this node's own release.
    pub(super) async fn scan_events(
        &self,
        b: BucketId,
        prefix: &str,
    ) -> Result<Vec<RawEvent>, StoreError> {
        let scope = scope_of(prefix);
        let Some(mut last) = self.be().last_revision(b, scope).await? else {
            return Ok(Vec::new());
        };
        self.hold_point(HoldPoint::Scan).await;
        let mut stream = self.open_watch(b, scope).await?;
        let mut seen = std::collections::BTreeMap::new();
        let mut reached = 0;
        // Read the last revision again once, on reaching the first: a key
        // written again before that re-read lies at or below its answer.
        // Once only: an answer past what the scope's watch ever delivers
        // must not keep the scan chasing.
        let mut reread = false;
        loop {
            match tokio::time::timeout(RECHECK, stream.next()).await {
                Ok(Some(Ok(ev))) => {
                    reached = reached.max(ev.revision());
                    let key = match &ev {
                        RawEvent::Put(e) => e.key.clone(),
                        RawEvent::Delete { key, .. } => key.clone(),
                    };
                    seen.insert(key, ev);
                    if reached < last {
                        continue;
                    }
                }
                Ok(Some(Err(e))) => return Err(e),
                Ok(None) => break,
                Err(_) => {
                    // Nothing came: the last revision read may be gone (its
                    // key removed), and then it is never delivered. After
                    // the re-read, what it covers has had its time.
                    if !reread && reached < last && self.be().revision_exists(b, last).await? {
                        continue;
                    }
                }
            }
            if reread {
                break;
            }
            reread = true;
            match self.be().last_revision(b, scope).await? {
                Some(now) if now > reached => last = now,
                _ => break,
            }
        }
        Ok(seen
            .into_iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(_, ev)| ev)
            .collect())
    }

    /// Open a watch, trying again when an attempt goes unanswered: on a
    /// cluster that has just lost a member, the server may place the
    /// watch's consumer on the member that is gone, and that request is
    /// never answered (server 2.9). The caller's bound still applies.
    pub(super) async fn open_watch(
        &self,
        b: BucketId,
        scope: &str,
    ) -> Result<RawEventStream, StoreError> {
        let attempt = (self.inner.timeout / 4).max(Duration::from_millis(200));
        loop {
            match tokio::time::timeout(attempt, self.be().watch(b, scope)).await {
                Ok(r) => return r,
                Err(_) => {
                    tracing::debug!(bucket = b.name(), "watch not opened in time; trying again")
                }
            }
        }
    }

    /// Every current value under `prefix`.
    pub(super) async fn scan(
        &self,
        b: BucketId,
        prefix: &str,
    ) -> Result<Vec<RawEntry>, StoreError> {
        Ok(self
            .scan_events(b, prefix)
            .await?
            .into_iter()
            .filter_map(|ev| match ev {
                RawEvent::Put(e) => Some(e),
                RawEvent::Delete { .. } => None,
            })
            .collect())
    }

    pub(super) async fn list_inner(&self, prefix: &str) -> Result<Vec<Lease>, StoreError> {
        let mut out = Vec::new();
        let mut buckets = Vec::new();
        if !prefix.starts_with("worker") {
            buckets.push(BucketId::Leases);
        }
        if prefix.starts_with("worker:") || "worker:".starts_with(prefix) {
            buckets.push(BucketId::Duties);
        }
        for b in buckets {
            for e in self.scan(b, prefix).await? {
                if e.key.starts_with(kv::EPOCH_KEY_PREFIX) {
                    // An atomic claim's epoch key is no lease.
                    continue;
                }
                match self.resolve(b, e) {
                    Ok(l) => out.push(l),
                    Err(err) => tracing::warn!(error = %err, "unreadable lease record skipped"),
                }
            }
        }
        let now = self.be().now();
        out.retain(|l| l.is_live(now));
        out.sort_by(|a, b| a.resource.cmp(&b.resource));
        Ok(out)
    }

    pub(super) fn entry(e: RawEntry) -> Entry {
        Entry {
            key: e.key,
            value: e.value,
            revision: e.revision,
            written_at: e.written_at,
        }
    }
}
