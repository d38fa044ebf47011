//! Which mailbox subjects hold stored mail, one listing for every
//! subscription of a queue: the stranded-mail net's first question.
//!
//! A look for stranded mail costs a consumer info and a stream read per
//! subscription; on an idle fleet the interest-retained agents stream
//! stores nothing, and every look finds nothing. One `STREAM.INFO` with a
//! subject filter (nats-server 2.9 and later) names every subject that
//! holds a stored message, so a subscription whose subject is not named
//! skips its look: mail can only be taken from where it is stored. A
//! listing is shared by every look that accepts its age; a look after a
//! new reason (an attach, a reconnect, a leader change) accepts only one
//! asked for after it began, since mail stranded then may be newer than
//! any listing. A listing that cannot be had, or that another look is
//! asking for at that moment, answers "may hold", so the look goes ahead
//! as it did before.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::stream;
use futures::TryStreamExt;
use tokio::time::Instant;

use super::{backend, bounded};
use crate::queue::QueueError;
use crate::watchdog::Progress;

/// The subjects holding stored mail, as of when the listing was asked for.
struct Listing {
    asked_at: Instant,
    subjects: Arc<HashSet<String>>,
}

/// One queue's listing, asked for by one look at a time (the others do
/// not wait for it).
pub(super) struct StoredSubjects {
    stream: stream::Stream,
    filter: String,
    timeout: Duration,
    last: tokio::sync::Mutex<Option<Listing>>,
}

impl StoredSubjects {
    pub(super) fn new(stream: stream::Stream, filter: &str, timeout: Duration) -> StoredSubjects {
        StoredSubjects {
            stream,
            filter: filter.to_string(),
            timeout,
            last: tokio::sync::Mutex::new(None),
        }
    }

    /// May `subject` hold stored mail, by a listing asked for at or after
    /// `not_before`? False only when such a listing does not name it.
    pub(super) async fn may_hold(
        &self,
        subject: &str,
        not_before: Instant,
        beat: &Progress<'_>,
    ) -> bool {
        ask(&self.last, subject, not_before, beat, || self.list()).await
    }

    /// Every subject of the stream holding a stored message, in pages.
    async fn list(&self) -> Result<HashSet<String>, QueueError> {
        let listing = async {
            let pages = self
                .stream
                .info_with_subjects(&self.filter)
                .await
                .map_err(backend)?;
            pages
                .map_ok(|(subject, _count)| subject)
                .try_collect::<HashSet<String>>()
                .await
                .map_err(backend)
        };
        bounded(self.timeout, listing).await?
    }
}

/// [`StoredSubjects::may_hold`] with the listing asked for by `list`. A
/// look that finds another one asking does not wait for it: it answers
/// "may hold" and its look goes ahead through the consumer, as it did
/// before listings. A wait here would not beat, and one listing bounded
/// by its own timeout is already a whole call's silence (chaos soak, seed
/// 13803 on nats-server 2.15.1: a reflect loop waited 3.2 s behind other
/// loops' listings during a leader restart, and its watchdog stopped the
/// node, exit 75).
async fn ask<F, Fut>(
    last: &tokio::sync::Mutex<Option<Listing>>,
    subject: &str,
    not_before: Instant,
    beat: &Progress<'_>,
    list: F,
) -> bool
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<HashSet<String>, QueueError>>,
{
    beat();
    let Ok(mut last) = last.try_lock() else {
        return true;
    };
    if let Some(l) = last.as_ref().filter(|l| l.asked_at >= not_before) {
        return names(&l.subjects, subject);
    }
    let asked_at = Instant::now();
    match list().await {
        Ok(subjects) => {
            let holds = names(&subjects, subject);
            *last = Some(Listing {
                asked_at,
                subjects: Arc::new(subjects),
            });
            holds
        }
        Err(e) => {
            tracing::debug!(error = %e, "cannot list the subjects holding stored mail; looking anyway");
            true
        }
    }
}

/// Pure: does a listing of `stored` subjects name one `filter` matches? A
/// subscription with no filter (the whole stream) always may hold mail.
fn names(stored: &HashSet<String>, filter: &str) -> bool {
    if filter.is_empty() {
        return true;
    }
    if filter.contains(['*', '>']) {
        return stored
            .iter()
            .any(|s| crate::queue::subject_matches(filter, s));
    }
    stored.contains(filter)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(subjects: &[&str]) -> HashSet<String> {
        subjects.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_subscription_may_hold_mail_only_where_the_listing_names_its_subject() {
        let stored = listing(&["crewlet.agent.a.inbox", "crewlet.agent.b.control"]);
        assert!(names(&stored, "crewlet.agent.a.inbox"));
        assert!(!names(&stored, "crewlet.agent.a.control"));
        assert!(!names(&stored, "crewlet.agent.c.inbox"));
    }

    fn asked(
        stored: &[&str],
    ) -> impl FnOnce() -> futures::future::Ready<Result<HashSet<String>, QueueError>> {
        let stored = listing(stored);
        move || futures::future::ready(Ok(stored))
    }

    fn never_asked() -> futures::future::Ready<Result<HashSet<String>, QueueError>> {
        panic!("a listing was asked for")
    }

    #[tokio::test(start_paused = true)]
    async fn a_listing_is_reused_while_it_is_new_enough_and_asked_again_after_a_reason() {
        let last = tokio::sync::Mutex::new(None);
        let begun = Instant::now();
        assert!(ask(&last, "s.a", begun, &|| {}, asked(&["s.a"])).await);
        tokio::time::advance(Duration::from_secs(5)).await;
        // Not older than the look accepts: no question to the stream.
        assert!(!ask(&last, "s.b", begun, &|| {}, never_asked).await);
        // A reason after it: asked again.
        let reason = Instant::now();
        assert!(ask(&last, "s.b", reason, &|| {}, asked(&["s.b"])).await);
        // A listing that cannot be had skips nothing.
        let later = Instant::now() + Duration::from_secs(1);
        let failing = || futures::future::ready(Err(QueueError::Timeout(Duration::from_secs(2))));
        assert!(ask(&last, "s.c", later, &|| {}, failing).await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_look_that_finds_another_asking_goes_ahead_without_waiting() {
        let last = Arc::new(tokio::sync::Mutex::new(None));
        let (answer, answered) = tokio::sync::oneshot::channel::<HashSet<String>>();
        let first = {
            let last = last.clone();
            tokio::spawn(async move {
                let list = || async move { Ok(answered.await.unwrap_or_default()) };
                ask(&last, "s.a", Instant::now(), &|| {}, list).await
            })
        };
        for _ in 0..100 {
            if last.try_lock().is_err() {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(last.try_lock().is_err(), "the first look is asking");
        let second = tokio::time::timeout(
            Duration::from_millis(1),
            ask(&last, "s.b", Instant::now(), &|| {}, never_asked),
        )
        .await;
        assert_eq!(second, Ok(true), "answered at once: may hold");
        answer.send(listing(&[])).unwrap();
        assert!(
            !first.await.unwrap(),
            "the first look's own listing names nothing"
        );
    }

    #[test]
    fn a_wildcard_or_missing_filter_is_matched_not_looked_up() {
        let stored = listing(&["crewlet.agent.b.control"]);
        assert!(names(&stored, "crewlet.agent.*.control"));
        assert!(names(&stored, "crewlet.agent.b.>"));
        assert!(!names(&stored, "crewlet.agent.a.>"));
        assert!(names(&stored, ""));
        assert!(names(&listing(&[]), ""));
    }
}
