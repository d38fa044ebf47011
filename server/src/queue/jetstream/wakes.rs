//! What ends a waiting pull early: the queue's wakes.
//!
//! An idle mailbox costs the broker its pull requests: each waits at the
//! consumer's leader until a message comes or it expires, and is then sent
//! again. A pull can wait long ([`PULL_WAIT`]) only while something tells
//! the queue when a waiting request may have been forgotten, which happens
//! two ways: the client reconnects (a server forgets the requests of a
//! connection it lost), or a leader is elected for the agents stream or
//! one of its consumers (the new leader knows nothing of the old one's
//! waiting requests; before 2.10.26 a consumer could also strand mail
//! then). Each of those is a *reason*: the waiting pulls it concerns end
//! and are sent again at once, waiting short the first time
//! ([`pull_wait_after`]), and their loops look for stranded mail soon
//! after — every pull for a reconnect or the stream's election, one
//! consumer's for that consumer's election ([`concerns`]).
//!
//! A queue follows them once the node hands it the store connection's
//! state ([`super::JetStreamQueue::follow`]); the elections come from the
//! server's advisories on two subjects, which carry nothing in the steady
//! state. A queue that follows nothing pulls every
//! [`FETCH_WAIT`](crate::queue::attach::FETCH_WAIT) and looks for
//! stranded mail on the clock alone, as before.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::watch;

use crate::coord::ConnectionState;
use crate::queue::QueueError;

/// How long a pull waits for a message while the queue follows its reasons.
pub const PULL_WAIT: Duration = Duration::from_secs(60);

/// How many looks for stranded mail a node starts a second, at most, after
/// a reason that concerns every pull: the looks of all its subscriptions
/// at once would flood the broker the moment it came back.
pub const LOOKS_PER_SECOND: u64 = 50;

/// Pure: how long after a reason `consumer`'s loop waits to look for
/// stranded mail when the node pulls `n` subscriptions: a fixed point, by
/// the name, of a window of `n / LOOKS_PER_SECOND` seconds.
pub fn look_offset(consumer: &str, n: usize) -> Duration {
    let window_ms = n as u64 * 1000 / LOOKS_PER_SECOND;
    if window_ms == 0 {
        return Duration::ZERO;
    }
    // FNV-1a: stable across processes and builds.
    let h = consumer.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    Duration::from_millis(h % window_ms)
}

/// Pure: how long a pull asked to wait `asked` does wait, when the reasons
/// seen at this consumer's last pull were `pulled` and are `seen` now. The
/// first pull after a reason is sent as its leader settles in, and may be
/// forgotten like the one the reason ended (a 3-server cluster's loaded
/// test run: mail published after a consumer's election waited past half a
/// long pull): it waits no longer than
/// [`FETCH_WAIT`](crate::queue::attach::FETCH_WAIT), so a forgotten one is
/// sent again within seconds; the pulls after it wait long again.
pub fn pull_wait_after(asked: Duration, pulled: u64, seen: u64) -> Duration {
    if pulled == seen {
        asked
    } else {
        asked.min(crate::queue::attach::FETCH_WAIT)
    }
}

/// The advisory subjects of an election for the agents stream and for its
/// consumers.
pub fn election_subjects(stream: &str) -> [String; 2] {
    [
        format!("$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.{stream}"),
        format!("$JS.EVENT.ADVISORY.CONSUMER.LEADER_ELECTED.{stream}.*"),
    ]
}

/// Pure: whether a change of the connection's state is a reconnect (the
/// connection is back after it was not).
pub fn is_reconnect(before: ConnectionState, now: ConnectionState) -> bool {
    now == ConnectionState::Connected && before != ConnectionState::Connected
}

/// What a reason concerns: every waiting pull (a reconnect, an election
/// for the stream), or one consumer's (an election for that consumer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Concerns {
    Every,
    Consumer(String),
}

/// Pure: what the election advisory on `subject` concerns, for `stream`.
pub fn concerns(stream: &str, subject: &str) -> Option<Concerns> {
    let [every, _] = election_subjects(stream);
    if subject == every {
        return Some(Concerns::Every);
    }
    let prefix = format!("$JS.EVENT.ADVISORY.CONSUMER.LEADER_ELECTED.{stream}.");
    subject
        .strip_prefix(&prefix)
        .filter(|c| !c.is_empty() && !c.contains('.'))
        .map(|c| Concerns::Consumer(c.to_string()))
}

/// The reasons seen — every pull's, and each consumer's own — and whether
/// anything is followed at all. A consumer's election wakes its own pull
/// only: a cluster restarting elects leaders for every consumer, and each
/// must not end every pull of the node.
#[derive(Clone)]
pub struct Wakes {
    every: Arc<watch::Sender<u64>>,
    own: Arc<Mutex<HashMap<String, Own>>>,
    followed: Arc<AtomicBool>,
}

/// One consumer's own reasons, shared by the map and each pull of it.
pub type Own = Arc<watch::Sender<u64>>;

impl Default for Wakes {
    fn default() -> Self {
        Wakes {
            every: Arc::new(watch::Sender::new(0)),
            own: Arc::default(),
            followed: Arc::new(AtomicBool::new(false)),
        }
    }
}

impl Wakes {
    /// Whether the queue follows its reasons (pulls may wait long).
    pub fn followed(&self) -> bool {
        self.followed.load(Ordering::SeqCst)
    }

    /// How long a pull waits: [`PULL_WAIT`] while the reasons are
    /// followed, else the loop's own [`FETCH_WAIT`](crate::queue::attach::FETCH_WAIT).
    pub fn pull_wait(&self) -> Duration {
        if self.followed() {
            PULL_WAIT
        } else {
            crate::queue::attach::FETCH_WAIT
        }
    }

    /// How often a quiet subscription looks for stranded mail on a server
    /// of JetStream API `level` ([`super::stranded_every`]), followed or
    /// not: a reason makes a look due soon, but a 2.9 or 2.10 consumer also
    /// strands mail with no election to tell of it (it passed every new
    /// message of its subject in the chaos soak), so on those servers the
    /// 30 s net stays under the reasons (chaos ci profile, 2.9.10, with a
    /// 5-minute net: four acknowledged messages lost).
    pub fn stranded_every(&self, level: u32) -> Duration {
        super::stranded_every(level)
    }

    /// How many reasons that concern every pull were seen so far.
    pub fn seen(&self) -> u64 {
        *self.every.borrow()
    }

    /// How many reasons that concern `consumer`'s pull were seen so far:
    /// every pull's and its own (while it is pulled here).
    pub fn seen_by(&self, consumer: &str) -> u64 {
        let own = self.lock().get(consumer).map_or(0, |s| *s.borrow());
        self.seen() + own
    }

    /// `consumer`'s own reasons, for a pull of it: kept while a pull holds
    /// them, so a reason that comes between two requests is counted.
    pub fn register(&self, consumer: &str) -> Own {
        self.lock()
            .entry(consumer.to_string())
            .or_insert_with(|| Arc::new(watch::Sender::new(0)))
            .clone()
    }

    /// Receivers that wake on the next reason concerning the pull that
    /// holds `own`: every pull's, and its own.
    pub fn listen(&self, own: &Own) -> (watch::Receiver<u64>, watch::Receiver<u64>) {
        (self.every.subscribe(), own.subscribe())
    }

    /// How long after a reason `consumer`'s loop waits to look for stranded
    /// mail ([`look_offset`] over the subscriptions this node pulls).
    pub fn look_offset(&self, consumer: &str) -> Duration {
        look_offset(consumer, self.lock().len())
    }

    /// A reason concerning `what`.
    pub fn wake(&self, what: &Concerns, why: &str) {
        match what {
            Concerns::Every => {
                tracing::debug!(reason = why, "every waiting pull ends and is sent again");
                self.every.send_modify(|n| *n += 1);
            }
            Concerns::Consumer(c) => {
                let mut own = self.lock();
                // A consumer no pull here holds any more (its seat left):
                // forgotten rather than counted.
                if own.get(c).is_some_and(|s| Arc::strong_count(s) == 1) {
                    own.remove(c);
                } else if let Some(s) = own.get(c) {
                    tracing::debug!(reason = why, consumer = %c, "its waiting pull ends and is sent again");
                    s.send_modify(|n| *n += 1);
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Own>> {
        self.own.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_followed(&self) {
        self.followed.store(true, Ordering::SeqCst);
    }
}

impl super::JetStreamQueue {
    /// Follow what can leave a waiting pull forgotten — the reconnects
    /// `connection` tells and the broker's leader elections for the agents
    /// stream — in a task of `tasks`; from then on pulls wait
    /// [`PULL_WAIT`] (this module). An election advisory that cannot be
    /// subscribed to is an error and leaves the queue as it was.
    pub async fn follow(
        &self,
        tasks: &crate::tasks::Tasks,
        connection: tokio::sync::watch::Receiver<crate::coord::ConnectionState>,
    ) -> Result<(), QueueError> {
        let client = self.js.client();
        let mut elections = Vec::new();
        for subject in election_subjects(super::AGENTS_STREAM) {
            let sub = super::bounded(self.settings.timeout, client.subscribe(subject.clone()))
                .await?
                .map_err(|e| super::backend(format!("subscribing to {subject}: {e}")))?;
            elections.push(sub);
        }
        self.wakes.set_followed();
        tasks.spawn(
            "queue-wakes",
            follow(
                self.wakes.clone(),
                connection,
                futures::stream::select_all(elections),
            ),
        );
        Ok(())
    }
}

/// Follow the reasons until the connection's state is gone: a reconnect
/// seen on `connection`, an election seen on `elections`.
pub(super) async fn follow(
    wakes: Wakes,
    mut connection: watch::Receiver<ConnectionState>,
    mut elections: futures::stream::SelectAll<async_nats::Subscriber>,
) {
    let mut before = *connection.borrow_and_update();
    loop {
        tokio::select! {
            changed = connection.changed() => {
                if changed.is_err() {
                    return;
                }
                let now = *connection.borrow_and_update();
                if is_reconnect(before, now) {
                    wakes.wake(&Concerns::Every, "the connection to the broker is back");
                }
                before = now;
            }
            Some(m) = elections.next() => {
                if let Some(what) = concerns(super::AGENTS_STREAM, &m.subject) {
                    wakes.wake(&what, &m.subject);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ConnectionState::*;

    #[test]
    fn only_a_connection_that_comes_back_is_a_reconnect() {
        assert!(is_reconnect(Disconnected, Connected));
        assert!(is_reconnect(Pending, Connected));
        assert!(!is_reconnect(Connected, Connected));
        assert!(!is_reconnect(Connected, Disconnected));
        assert!(!is_reconnect(Disconnected, Disconnected));
    }

    #[test]
    fn the_elections_followed_are_the_agents_stream_and_every_consumer_of_it() {
        assert_eq!(
            election_subjects("CREWLET_AGENTS"),
            [
                "$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.CREWLET_AGENTS".to_string(),
                "$JS.EVENT.ADVISORY.CONSUMER.LEADER_ELECTED.CREWLET_AGENTS.*".to_string(),
            ]
        );
    }

    #[test]
    fn an_election_concerns_every_pull_for_the_stream_and_one_consumers_for_a_consumer() {
        let s = "CREWLET_AGENTS";
        let c = |x: &str| concerns(s, x);
        assert_eq!(
            c("$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.CREWLET_AGENTS"),
            Some(Concerns::Every)
        );
        assert_eq!(
            c("$JS.EVENT.ADVISORY.CONSUMER.LEADER_ELECTED.CREWLET_AGENTS.agent-ann"),
            Some(Concerns::Consumer("agent-ann".into()))
        );
        assert_eq!(
            c("$JS.EVENT.ADVISORY.CONSUMER.LEADER_ELECTED.CREWLET_AGENTS."),
            None
        );
        assert_eq!(
            c("$JS.EVENT.ADVISORY.CONSUMER.LEADER_ELECTED.OTHER.agent-ann"),
            None
        );
        assert_eq!(c("$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.OTHER"), None);
    }

    #[test]
    fn a_followed_queue_on_a_2_9_or_2_10_server_still_looks_for_stranded_mail_every_30_s() {
        let w = Wakes::default();
        w.set_followed();
        assert_eq!(w.pull_wait(), PULL_WAIT, "followed: pulls wait long");
        assert_eq!(w.stranded_every(0), Duration::from_secs(30));
        assert_eq!(w.stranded_every(1), Duration::from_secs(300));
        let unfollowed = Wakes::default();
        assert_eq!(unfollowed.stranded_every(0), Duration::from_secs(30));
    }

    #[tokio::test]
    async fn a_consumers_election_wakes_its_own_pull_and_a_reconnect_wakes_every_pull() {
        let w = Wakes::default();
        let (a, b) = (w.register("a"), w.register("b"));
        let (mut a_every, mut a_own) = w.listen(&a);
        let (mut b_every, b_own) = w.listen(&b);
        assert!(!w.followed());
        w.wake(&Concerns::Consumer("a".into()), "test");
        a_own.changed().await.unwrap();
        assert!(!b_own.has_changed().unwrap(), "b's pull goes on");
        assert_eq!((w.seen_by("a"), w.seen_by("b"), w.seen()), (1, 0, 0));
        w.wake(&Concerns::Every, "test");
        a_every.changed().await.unwrap();
        b_every.changed().await.unwrap();
        assert_eq!((w.seen_by("a"), w.seen_by("b"), w.seen()), (2, 1, 1));
    }

    #[test]
    fn the_looks_after_a_reason_are_spread_by_name_over_a_window_that_grows_with_the_subscriptions()
    {
        assert_eq!(look_offset("agent-a", 0), Duration::ZERO);
        let window = |n: usize| Duration::from_millis(n as u64 * 1000 / LOOKS_PER_SECOND);
        let offsets: Vec<Duration> = (0..150)
            .map(|i| look_offset(&format!("agent-seat-{i}"), 150))
            .collect();
        assert!(offsets.iter().all(|o| *o < window(150)));
        let first_half = offsets.iter().filter(|o| **o < window(150) / 2).count();
        assert!(
            (50..=100).contains(&first_half),
            "spread, not bunched: {first_half} of 150 in the first half"
        );
        assert_eq!(
            look_offset("agent-a", 150),
            look_offset("agent-a", 150),
            "the same place each time"
        );
    }

    #[test]
    fn the_first_pull_after_a_reason_waits_short_and_the_ones_after_it_long() {
        let short = crate::queue::attach::FETCH_WAIT;
        assert_eq!(pull_wait_after(PULL_WAIT, 3, 4), short, "after a reason");
        assert_eq!(pull_wait_after(PULL_WAIT, u64::MAX, 0), short, "the first");
        assert_eq!(pull_wait_after(PULL_WAIT, 4, 4), PULL_WAIT, "no new reason");
        let coalescing = Duration::from_millis(10);
        assert_eq!(
            pull_wait_after(coalescing, 3, 4),
            coalescing,
            "never longer"
        );
    }

    #[test]
    fn an_election_for_a_consumer_nobody_pulls_is_forgotten_not_counted() {
        let w = Wakes::default();
        drop(w.register("gone"));
        w.wake(&Concerns::Consumer("gone".into()), "test");
        w.wake(&Concerns::Consumer("never".into()), "test");
        assert!(w.lock().is_empty());
        assert_eq!(w.seen_by("gone"), 0);
    }

    #[test]
    fn an_election_between_two_requests_of_a_pull_is_counted() {
        let w = Wakes::default();
        let own = w.register("between");
        // No request waits (no receiver): the pull still holds its reasons.
        w.wake(&Concerns::Consumer("between".into()), "test");
        assert_eq!(w.seen_by("between"), 1);
        assert_eq!(*own.borrow(), 1);
    }
}
