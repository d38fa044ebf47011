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
//! then). Each of those is a *reason*: every waiting pull ends and is sent
//! again at once, and every loop looks for stranded mail soon after.
//!
//! A queue follows them once the node hands it the store connection's
//! state ([`super::JetStreamQueue::follow`]); the elections come from the
//! server's advisories on two subjects, which carry nothing in the steady
//! state. A queue that follows nothing pulls every
//! [`FETCH_WAIT`](crate::queue::attach::FETCH_WAIT) and looks for
//! stranded mail on the clock alone, as before.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::watch;

use crate::coord::ConnectionState;
use crate::queue::QueueError;

/// How long a pull waits for a message while the queue follows its reasons.
pub const PULL_WAIT: Duration = Duration::from_secs(60);

/// How often a quiet subscription looks for stranded mail while the queue
/// follows its reasons, whatever the server: each reason makes it look
/// soon, so this is the net under them.
pub const STRANDED_EVERY_FOLLOWED: Duration = Duration::from_secs(300);

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

/// The count of reasons seen, and whether anything is followed at all.
#[derive(Clone)]
pub struct Wakes {
    reasons: Arc<watch::Sender<u64>>,
    followed: Arc<AtomicBool>,
}

impl Default for Wakes {
    fn default() -> Self {
        Wakes {
            reasons: Arc::new(watch::Sender::new(0)),
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
    /// of JetStream API `level`: [`STRANDED_EVERY_FOLLOWED`] while the
    /// reasons are followed, else by the server's level alone
    /// ([`super::stranded_every`]).
    pub fn stranded_every(&self, level: u32) -> Duration {
        if self.followed() {
            STRANDED_EVERY_FOLLOWED
        } else {
            super::stranded_every(level)
        }
    }

    /// How many reasons were seen so far.
    pub fn seen(&self) -> u64 {
        *self.reasons.borrow()
    }

    /// A receiver that wakes on the next reason.
    pub fn listen(&self) -> watch::Receiver<u64> {
        self.reasons.subscribe()
    }

    /// One more reason: every waiting pull ends.
    pub fn wake(&self, why: &str) {
        tracing::debug!(reason = why, "waiting pulls end and are sent again");
        self.reasons.send_modify(|n| *n += 1);
    }

    pub(super) fn set_followed(&self) {
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
                    wakes.wake("the connection to the broker is back");
                }
                before = now;
            }
            Some(m) = elections.next() => wakes.wake(&m.subject),
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

    #[tokio::test]
    async fn a_wake_is_seen_by_every_listener_and_counted() {
        let w = Wakes::default();
        let mut a = w.listen();
        let mut b = w.listen();
        assert!(!w.followed());
        w.wake("test");
        a.changed().await.unwrap();
        b.changed().await.unwrap();
        assert_eq!(w.seen(), 1);
    }
}
