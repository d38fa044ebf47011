//! When a dispatch loop looks for stranded mail ([`Source::take_stranded`]):
//! at attach, every [`Source::stranded_every`], soon after a reason (a
//! reconnect, an election) or a fetch error, and again soon after a look
//! that could not go ahead or found some — and how long a fetch may wait
//! meanwhile, which is never past the next look.

use std::time::Duration;

use super::{Fetched, Loop, MIN_FETCH_WAIT, STRANDED_AFTER_ERROR, Source, trace};
use crate::queue::QueueEvent;

/// Look for stranded mail: what was found, and when the next look is due
/// (soon when something was found: a consumer that strands mail may go on
/// stranding what arrives).
pub(super) async fn look_for_stranded(
    l: &Loop,
    quiet_since: tokio::time::Instant,
) -> (Vec<Fetched>, tokio::time::Instant) {
    let now = tokio::time::Instant::now();
    let idle = now.saturating_duration_since(quiet_since);
    let beat = || l.pulse.beat();
    match l.source.take_stranded(&*l.handler, idle, &beat).await {
        Ok(Some(found)) => {
            for f in &found {
                trace("fetched", &l.subscription, &f.delivery, "stranded");
                (l.events)(QueueEvent::Recovered {
                    subscription: l.subscription.clone(),
                    subject: f.delivery.subject.clone(),
                    seq: f.delivery.seq,
                });
            }
            let due = if found.is_empty() {
                l.source.stranded_every()
            } else {
                STRANDED_AFTER_ERROR
            };
            (found, now + due)
        }
        Ok(None) => (Vec::new(), now + STRANDED_AFTER_ERROR),
        Err(e) => {
            tracing::warn!(subscription = %l.subscription, error = %e, "cannot look for stranded mail; looking again soon");
            (Vec::new(), now + STRANDED_AFTER_ERROR)
        }
    }
}

/// How long the next fetch waits: the source's own wait, but never past
/// the next look for stranded mail. A long pull (a minute, while the queue
/// follows its reasons) would otherwise put off a look due in 2 s (one that
/// found a delivery awaiting its acknowledgement) or in 30 s (the net on
/// servers that strand mail) until the pull came back empty (chaos ci
/// profile, 2.9.10: a new holder's look at attach met a delivery its killed
/// predecessor never acknowledged, and the next came a minute later).
pub(super) fn fetch_wait(source: &dyn Source, look_due: tokio::time::Instant) -> Duration {
    let until_look = look_due.saturating_duration_since(tokio::time::Instant::now());
    source.fetch_wait().min(until_look.max(MIN_FETCH_WAIT))
}

/// When the next look for stranded mail is due, given it was due at `due`
/// and the source's reasons (a reconnect, an election) were `reasons`: a
/// new one makes it due once acknowledgements on their way have landed,
/// at the loop's own offset ([`Source::look_offset`]).
pub(super) fn due_with_reasons(
    source: &dyn Source,
    reasons: &mut u64,
    due: tokio::time::Instant,
) -> tokio::time::Instant {
    let seen = source.reasons();
    if seen == *reasons {
        return due;
    }
    *reasons = seen;
    due.min(tokio::time::Instant::now() + STRANDED_AFTER_ERROR + source.look_offset())
}
