//! The consuming loop every backend shares, and the [`Attachment`] that
//! owns it.
//!
//! Holds and quiesce gate the fetch (nothing is fetched while either is in
//! force, and holds passed to `attach` are in force before the first
//! fetch); Defer hands the delivery back at once and quiesces; a message
//! past its delivery budget, or one its handler calls poison, is
//! dead-lettered visibly; a handler panic is caught and the delivery handed
//! back. Mail a broker stranded (stored for the subscription but behind the
//! point it says it delivered, awaiting no acknowledgement — or only
//! acknowledgements the broker would long have asked back, the loop idle
//! meanwhile) is taken from
//! where it is stored and handled like a delivery: looked for at attach,
//! after a fetch error, every [`STRANDED_EVERY`], and soon again after a
//! look that found some.
//! While a handler runs, every delivery it was given is kept from its
//! ack window by an in-progress acknowledgement each time the
//! attachment's owner calls [`Attachment::extend`] — the seat host does on
//! every successful renewal of the seat's lease, so the heartbeat (a loop
//! the watchdog watches) is what keeps a turn's mail: a node that dies or
//! wedges, or whose seat is fenced, stops extending and its mail comes back
//! within one window, while a long turn on a live, owning node is never
//! redelivered for running long.
//! A handler still running when the attachment is detached is
//! neither waited for nor abandoned: it finishes on its own task and
//! settles what it took — with no more extensions (a fenced or detached
//! seat stops asking for time). A backend supplies only [`Source`] (fetch one) and [`Settle`]
//! (ack / nak / dead-letter one). This loop never decides whether this node
//! should be consuming — its owner (the seat host) does.
//!
//! Every step of a delivery's life here — fetched (or taken stranded),
//! handed back at a closed gate, settled and how, dead-lettered — is a
//! DEBUG line under the `crewlet::delivery` target with the subscription,
//! stream sequence, delivery count and message id ([`trace`]), so that a
//! message's whole story can be told from the nodes' logs
//! (docs/config.md § `[logging]`).

use std::collections::BTreeSet;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{DeadLetterReason, Delivery, Disposition, EventSink, Handler, QueueError, QueueEvent};
use crate::watchdog::{Progress, Pulse};

mod depth;
mod looks;
use depth::Depth;
use looks::{due_with_reasons, fetch_wait, look_for_stranded};

/// One fetched, unsettled message.
pub struct Fetched {
    pub delivery: Delivery,
    pub settle: Box<dyn Settle>,
}

/// Fetch the next message of one subscription.
#[async_trait::async_trait]
pub trait Source: Send + Sync + 'static {
    /// Wait up to `wait` for one message; `None` when none came. Dropping
    /// the future before it returns must lose no message.
    async fn next(&self, wait: Duration) -> Result<Option<Fetched>, QueueError>;

    /// Take every message the broker stranded, from where it is stored:
    /// stored for this subscription, at or behind the point it says it
    /// delivered, while no delivery awaits its acknowledgement — or while
    /// the ones that do have awaited it so long that the broker would have
    /// handed them back were they real: `idle` is how long this loop has
    /// taken nothing and expects nothing back of its own (a hand-back it
    /// delayed). Below the acknowledgement floor `judge` decides
    /// ([`Handler::answered`]). Each is settled where it is stored
    /// (acknowledged: removed; handed back: left for the next look).
    /// `None`: not now (a delivery awaits its acknowledgement; ask again
    /// later). A backend whose deliveries cannot strand has nothing to
    /// take. `beat` is the loop's: called before each broker or store call
    /// the look makes (each within its own bound), so a look of many calls
    /// is not taken for a wedged loop, and one call past its bound is.
    async fn take_stranded(
        &self,
        _judge: &dyn Handler,
        _idle: Duration,
        _beat: &Progress<'_>,
    ) -> Result<Option<Vec<Fetched>>, QueueError> {
        Ok(Some(Vec::new()))
    }

    /// How often a quiet subscription looks for stranded mail.
    fn stranded_every(&self) -> Duration {
        STRANDED_EVERY
    }

    /// How long one fetch waits for a message before the loop looks again
    /// ([`FETCH_WAIT`]). A source whose fetch wakes on every change of its
    /// subscription (a message, a hand-back, a delay running out) can wait
    /// longer: its quiet loops then cost nothing between changes.
    fn fetch_wait(&self) -> Duration {
        FETCH_WAIT
    }

    /// How many reasons to look for stranded mail the source has seen (a
    /// reconnect, a leader election: `jetstream::wakes`); each new one
    /// makes the loop look soon. A source that knows none says 0.
    fn reasons(&self) -> u64 {
        0
    }

    /// How much later than [`STRANDED_AFTER_ERROR`] this loop looks after a
    /// reason, so that a node's loops do not all look at once.
    fn look_offset(&self) -> Duration {
        Duration::ZERO
    }
}

/// Settle one fetched message.
#[async_trait::async_trait]
pub trait Settle: Send + Sync + 'static {
    /// The delivery is still being worked on: restart its ack window
    /// (JetStream's in-progress acknowledgement). A message taken from
    /// where it is stored has no window to restart.
    async fn progress(&self) -> Result<(), QueueError> {
        Ok(())
    }
    async fn ack(self: Box<Self>) -> Result<(), QueueError>;
    /// Hand it back for redelivery at once.
    async fn nak(self: Box<Self>) -> Result<(), QueueError>;
    /// Hand it back for redelivery no sooner than `delay` from now (it
    /// stays unsettled until then, as JetStream keeps a delayed NAK).
    async fn nak_after(self: Box<Self>, delay: Duration) -> Result<(), QueueError>;
    /// Copy it where a person can inspect it, then remove it from the
    /// subscription for good. When the copy fails the message is handed
    /// back instead (never dropped).
    async fn dead_letter(self: Box<Self>, reason: &DeadLetterReason) -> Result<(), QueueError>;
}

#[derive(Clone, Debug, Default)]
struct Gate {
    holds: BTreeSet<String>,
    quiesced: bool,
}

impl Gate {
    fn open(&self) -> bool {
        self.holds.is_empty() && !self.quiesced
    }
}

/// A consumer attached to a subscription. Dropping it stops the loop (the
/// same as [`Attachment::detach`] without waiting).
pub struct Attachment {
    subscription: String,
    gate: Arc<watch::Sender<Gate>>,
    busy: watch::Receiver<bool>,
    extend: Arc<watch::Sender<u64>>,
    cancel: CancellationToken,
    /// Set by [`Attachment::abandon`]: the running handler is dropped and
    /// what it took handed back.
    drop_in_flight: Arc<std::sync::atomic::AtomicBool>,
    task: Option<JoinHandle<()>>,
    /// The dispatch loop's beat (the watchdog follows it).
    pulse: Pulse,
    /// What the loop knows of the subscription's depth.
    depth: Depth,
}

/// A wait for an attachment's running handler to finish
/// ([`Attachment::idle`]).
pub struct Idle(watch::Receiver<bool>);

impl Idle {
    /// Wait up to `within`; true when nothing is in flight any more.
    pub async fn within(mut self, within: Duration) -> bool {
        tokio::time::timeout(within, self.0.wait_for(|b| !*b))
            .await
            .map(|r| r.is_ok())
            .unwrap_or(false)
    }
}

// The dispatch loop beats as it turns and marks as waiting
// (`Pulse::waiting`) what is allowed to take long: a closed gate (a paused
// or quiesced seat), a fetch (bounded by construction), a backoff and the
// turn it dispatched — no timer per loop while it waits. A broker call
// (a settle, an extension, each call of the stranded-mail look) is not a
// wait: the loop beats before each, and one that outlives its own bound
// stops the beat, so the watchdog sees it wedged.

/// How long one fetch waits for a message before the loop looks again.
pub const FETCH_WAIT: Duration = Duration::from_secs(5);
/// How long a coalescing fetch waits for one more waiting message.
pub const COALESCE_WAIT: Duration = Duration::from_millis(10);
/// How often an attached loop looks for stranded mail when nothing else
/// made it look (it also looks at attach and after a fetch error), unless
/// its source says otherwise ([`Source::stranded_every`]).
pub const STRANDED_EVERY: Duration = Duration::from_secs(30);
/// The shortest wait a fetch is given, however soon a look is due.
pub const MIN_FETCH_WAIT: Duration = Duration::from_millis(100);
/// After a fetch error, how long the loop lets acknowledgements already
/// on their way land before it looks for stranded mail.
pub const STRANDED_AFTER_ERROR: Duration = Duration::from_secs(2);

impl Attachment {
    pub(crate) fn start(
        subscription: String,
        max_deliveries: u64,
        holds: &[&str],
        source: Arc<dyn Source>,
        handler: Arc<dyn Handler>,
        events: EventSink,
    ) -> Attachment {
        let gate = Arc::new(watch::Sender::new(Gate {
            holds: holds.iter().map(|h| h.to_string()).collect(),
            quiesced: false,
        }));
        let (busy_tx, busy) = watch::channel(false);
        let extend = Arc::new(watch::Sender::new(0u64));
        let cancel = CancellationToken::new();
        let drop_in_flight = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let pulse = Pulse::new();
        let depth = Depth::default();
        let fut = consume(Loop {
            pulse: pulse.clone(),
            depth: depth.clone(),
            subscription: subscription.clone(),
            max_deliveries,
            extensions: extend.subscribe(),
            gate: gate.clone(),
            busy: busy_tx,
            cancel: cancel.clone(),
            drop_in_flight: drop_in_flight.clone(),
            source,
            handler,
            events,
        });
        let task = crate::tasks::spawn_held("dispatch", fut);
        Attachment {
            subscription,
            gate,
            busy,
            extend,
            cancel,
            drop_in_flight,
            task: Some(task),
            pulse,
            depth,
        }
    }

    /// The messages waiting for the subscription — stored, not yet
    /// settled — as the dispatch loop knows them without asking the
    /// broker: known while it waits in its fetch with nothing in hand
    /// (then only its own delayed hand-backs wait); `None` while a turn
    /// runs, the gate is closed or the loop has not fetched yet — ask the
    /// broker ([`Queue::pending`](super::Queue::pending)).
    pub fn depth(&self) -> Option<u64> {
        self.depth.read()
    }

    /// The dispatch loop's beat: live until the loop ends.
    pub fn pulse(&self) -> Pulse {
        self.pulse.clone()
    }

    pub fn subscription(&self) -> &str {
        &self.subscription
    }

    /// Take a named hold: nothing is fetched while any hold is taken.
    pub fn hold(&self, name: &str) {
        self.gate.send_modify(|g| {
            g.holds.insert(name.to_string());
        });
    }

    /// Drop a named hold.
    pub fn unhold(&self, name: &str) {
        self.gate.send_modify(|g| {
            g.holds.remove(name);
        });
    }

    /// The holds in force.
    pub fn holds(&self) -> Vec<String> {
        self.gate.borrow().holds.iter().cloned().collect()
    }

    /// Stop fetching (the in-flight handler, if any, finishes).
    pub fn quiesce(&self) {
        self.gate.send_modify(|g| g.quiesced = true);
    }

    /// Fetch again (after a quiesce or a Defer).
    pub fn resume(&self) {
        self.gate.send_modify(|g| g.quiesced = false);
    }

    pub fn is_quiesced(&self) -> bool {
        self.gate.borrow().quiesced
    }

    /// The subscription is still this owner's: restart the ack window of
    /// every delivery the running handler holds (an in-progress
    /// acknowledgement each). The seat host calls it on every successful
    /// renewal of the seat's lease; nothing else extends a delivery.
    pub fn extend(&self) {
        self.extend.send_modify(|n| *n += 1);
    }

    /// True while a handler is running.
    pub fn in_flight(&self) -> bool {
        *self.busy.borrow()
    }

    /// Wait up to `within` for the running handler (if any) to finish.
    /// True when nothing is in flight any more.
    pub async fn wait_idle(&self, within: Duration) -> bool {
        self.idle().within(within).await
    }

    /// A wait for the running handler to finish that does not borrow the
    /// attachment (its holder may keep it behind a lock meanwhile).
    pub fn idle(&self) -> Idle {
        Idle(self.busy.clone())
    }

    /// Stop consuming. Non-destructive: the subscription and what it
    /// retains survive. Does not wait for a running handler: it goes on, on
    /// its own task, and its answer settles what it took (a turn whose seat
    /// was fenced stops at its next round or call and hands its delivery
    /// back — or records and acknowledges it when its effects already
    /// left). Dropping the handler instead handed the delivery to the
    /// seat's next holder while the effect it was posting still landed.
    pub async fn detach(mut self) {
        self.cancel.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }

    /// Stop consuming and drop the running handler, handing what it took
    /// back at once (one delivery spent): how the tests play a node that
    /// died with a delivery in flight and was replaced at once. A node
    /// never abandons its own handler ([`Attachment::detach`]).
    pub async fn abandon(self) {
        self.drop_in_flight
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.detach().await
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

struct Loop {
    subscription: String,
    drop_in_flight: Arc<std::sync::atomic::AtomicBool>,
    max_deliveries: u64,
    /// Bumped by [`Attachment::extend`].
    extensions: watch::Receiver<u64>,
    gate: Arc<watch::Sender<Gate>>,
    busy: watch::Sender<bool>,
    cancel: CancellationToken,
    source: Arc<dyn Source>,
    handler: Arc<dyn Handler>,
    events: EventSink,
    pulse: Pulse,
    depth: Depth,
}

/// Ends the dispatch loop's pulse when the loop returns (or is dropped).
struct EndPulse(Pulse);

impl Drop for EndPulse {
    fn drop(&mut self) {
        self.0.end();
    }
}

async fn settle_or_log(what: &str, sub: &str, r: Result<(), QueueError>) {
    if let Err(e) = r {
        tracing::warn!(subscription = sub, error = %e, "cannot {what} a delivery");
    }
}

/// One step of `d`'s life on this node: a DEBUG line under the
/// `crewlet::delivery` target (its fields are a public contract,
/// docs/config.md § `[logging]`). `step` is `fetched`, `returned`, `settled` or
/// `dead_lettered`; `what` says how (`fetch` or `stranded`; `ack`, `nak`,
/// `retry 2s`, `defer: …`, `poison: …`; `failed: …` when the broker
/// refused the settle).
pub fn trace(step: &'static str, sub: &str, d: &Delivery, what: &str) {
    tracing::debug!(
        target: "crewlet::delivery",
        step,
        subscription = sub,
        seq = d.seq,
        delivered = d.delivered,
        msg_id = d.msg_id.as_deref().unwrap_or(""),
        what,
    );
}

/// Settle with `r`'s outcome traced and, when the broker refused, logged.
async fn settled(what: &str, sub: &str, d: &Delivery, r: Result<(), QueueError>) {
    match &r {
        Ok(()) => trace("settled", sub, d, what),
        Err(e) => trace("settled", sub, d, &format!("failed: {what}: {e}")),
    }
    settle_or_log(what, sub, r).await;
}

async fn consume(l: Loop) {
    let _end = EndPulse(l.pulse.clone());
    let mut gate = l.gate.subscribe();
    let mut backoff = Duration::from_millis(100);
    // Due at once: mail stranded while nobody was attached is found at attach.
    let mut stranded_due = tokio::time::Instant::now();
    // Stranded mail taken from the stream, handled before the next fetch.
    let mut recovered: std::collections::VecDeque<Fetched> = Default::default();
    // Since when this loop took nothing and expects nothing back (a delayed hand-back's wait).
    let mut quiet_since = tokio::time::Instant::now();
    let mut reasons = l.source.reasons();
    loop {
        l.pulse.beat();
        tokio::select! {
            _ = l.cancel.cancelled() => return,
            r = l.pulse.waiting(gate.wait_for(Gate::open)) => if r.is_err() { return },
        }
        stranded_due = due_with_reasons(&*l.source, &mut reasons, stranded_due);
        if recovered.is_empty() && tokio::time::Instant::now() >= stranded_due {
            let (found, due) = tokio::select! {
                _ = l.cancel.cancelled() => return,
                r = Box::pin(look_for_stranded(&l, quiet_since)) => r,
            };
            recovered.extend(found);
            stranded_due = due;
        }
        let fetched = match recovered.pop_front() {
            Some(f) => Ok(Some(f)),
            None => tokio::select! {
                _ = l.cancel.cancelled() => return,
                r = l.pulse.waiting(l.depth.idle_while(l.source.next(fetch_wait(&*l.source, stranded_due)))) => {
                    if let Ok(Some(f)) = &r {
                        trace("fetched", &l.subscription, &f.delivery, "fetch");
                    }
                    r
                }
            },
        };
        let Fetched { delivery, settle } = match fetched {
            Ok(Some(f)) => {
                backoff = Duration::from_millis(100);
                quiet_since = tokio::time::Instant::now();
                f
            }
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!(subscription = %l.subscription, error = %e, "fetch failed; retrying");
                // A fetch error can be the broker changing leaders, which
                // can strand mail behind the new leader's pointer.
                stranded_due = stranded_due.min(tokio::time::Instant::now() + STRANDED_AFTER_ERROR);
                tokio::select! {
                    _ = l.cancel.cancelled() => return,
                    _ = l.pulse.waiting(tokio::time::sleep(backoff)) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        let batch = Box::pin(coalesce(&l, (delivery, settle), &mut recovered)).await;
        // A hold or quiesce that arrived during the fetch: hand it back.
        if !l.gate.borrow().open() || l.cancel.is_cancelled() {
            Box::pin(hand_back(&l, batch, "closed gate")).await;
            continue;
        }
        let mut live = Vec::with_capacity(batch.len());
        for (delivery, settle) in batch {
            if delivery.delivered > l.max_deliveries {
                let reason = DeadLetterReason::MaxDeliveries(delivery.delivered - 1);
                Box::pin(dead_letter(&l, &delivery, settle, reason)).await;
                l.pulse.beat();
            } else {
                live.push((delivery, settle));
            }
        }
        if live.is_empty() {
            continue;
        }
        match Box::pin(handle_batch(&l, live)).await {
            Some(back_in) => quiet_since = tokio::time::Instant::now() + back_in,
            None => return,
        }
    }
}

/// Coalesce: whatever else is already waiting (recovered first), up to
/// the handler's limit, goes in the same partition as `first`. Beating
/// while it fetches (chaos ci profile under load: a node's seat loop
/// coalesced three deliveries from a broker answering each fetch in about
/// 0.7 s and went 3.5 s without a beat; its watchdog shot it, exit 75).
async fn coalesce(
    l: &Loop,
    first: (Delivery, Box<dyn Settle>),
    recovered: &mut std::collections::VecDeque<Fetched>,
) -> Vec<(Delivery, Box<dyn Settle>)> {
    let mut batch = vec![first];
    let limit = l.handler.batch_limit().max(1);
    while batch.len() < limit && l.gate.borrow().open() && !l.cancel.is_cancelled() {
        if let Some(f) = recovered.pop_front() {
            batch.push((f.delivery, f.settle));
            continue;
        }
        // Each fetch is bounded, but a broker slow to answer makes the
        // batch's fetches add up: the loop beats while it waits on them.
        match l.pulse.waiting(l.source.next(COALESCE_WAIT)).await {
            Ok(Some(f)) => {
                trace("fetched", &l.subscription, &f.delivery, "fetch");
                batch.push((f.delivery, f.settle))
            }
            Ok(None) => break,
            Err(e) => {
                tracing::debug!(subscription = %l.subscription, error = %e, "coalescing fetch failed");
                break;
            }
        }
    }
    batch
}

/// Hand each of `batch` back to the broker (`why` goes into its trace),
/// beating after each: every hand-back is bounded, a batch of them is not.
async fn hand_back(l: &Loop, batch: Vec<(Delivery, Box<dyn Settle>)>, why: &str) {
    for (d, settle) in batch {
        trace("returned", &l.subscription, &d, why);
        settled("nak", &l.subscription, &d, settle.nak().await).await;
        l.pulse.beat();
    }
}

/// Wait for the handler's `run` — a wait, however long the turn — while
/// extending the ack window of `live` each time the owner says the seat is
/// still its own; `None` when the loop was cancelled first. The deliveries
/// are kept while the handler runs (queued behind the seat's turn lock, or
/// in its turn), and only until the seat is detached. Each extension is a
/// broker call of its own, beaten before it is made (one past its bound
/// stops the beat).
async fn await_handler<R>(
    l: &Loop,
    run: &mut JoinHandle<R>,
    live: &[(Delivery, Box<dyn Settle>)],
) -> Option<Result<R, tokio::task::JoinError>> {
    let mut extensions = l.extensions.clone();
    extensions.mark_unchanged();
    loop {
        let woke = l
            .pulse
            .waiting(async {
                tokio::select! {
                    _ = l.cancel.cancelled() => Woke::Cancelled,
                    r = &mut *run => Woke::Ran(r),
                    Ok(()) = extensions.changed() => Woke::Extend,
                }
            })
            .await;
        match woke {
            Woke::Cancelled => return None,
            Woke::Ran(r) => return Some(r),
            Woke::Extend => {
                for (d, settle) in live {
                    l.pulse.beat();
                    if let Err(e) = settle.progress().await {
                        tracing::debug!(subscription = %l.subscription, seq = d.seq, error = %e, "cannot extend a delivery's ack window");
                    }
                }
            }
        }
    }
}

/// What ended a wait on the handler's run.
enum Woke<R> {
    Cancelled,
    Ran(R),
    /// The owner renewed the seat: extend the deliveries' ack window.
    Extend,
}

/// Run the handler on `live` and settle each delivery by its answer,
/// beating and extending the deliveries' ack window while it runs: how
/// long until the last delivery it handed back with a delay is due again
/// (zero when none was). `None` when the loop was detached meanwhile and
/// must end (what was in flight returned, or left to settle on its own
/// task).
async fn handle_batch(l: &Loop, live: Vec<(Delivery, Box<dyn Settle>)>) -> Option<Duration> {
    let deliveries: Vec<Delivery> = live.iter().map(|(d, _)| d.clone()).collect();
    let _ = l.busy.send(true);
    let handler = l.handler.clone();
    let mut run = crate::tasks::spawn_held("handler", async move {
        AssertUnwindSafe(async {
            if deliveries.len() == 1 {
                vec![handler.handle(deliveries[0].clone()).await]
            } else {
                handler.handle_batch(deliveries).await
            }
        })
        .catch_unwind()
        .await
    });
    let outcome = await_handler(l, &mut run, &live).await;
    let _ = l.busy.send(false);
    let dispositions = match outcome {
        None if l.drop_in_flight.load(std::sync::atomic::Ordering::SeqCst) => {
            run.abort();
            hand_back(l, live, "abandoned").await;
            return None;
        }
        None => {
            // Detached with these in flight: the handler finishes on
            // its own and its answer settles them.
            let (subscription, events) = (l.subscription.clone(), l.events.clone());
            crate::tasks::spawn_held("detached settle", async move {
                let n = live.len();
                let dispositions = match run.await {
                    Ok(Ok(d)) => d,
                    _ => {
                        tracing::error!(subscription = %subscription, "a handler panicked; the deliveries go back");
                        vec![Disposition::Nak; n]
                    }
                };
                settle_all(&subscription, &events, live, dispositions, &|| {}).await;
            });
            return None;
        }
        Some(Ok(Ok(d))) => d,
        Some(_) => {
            tracing::error!(subscription = %l.subscription, "a handler panicked; the deliveries go back");
            vec![Disposition::Nak; live.len()]
        }
    };
    // Quiesce before any hand-back of a Defer, so the next fetch
    // cannot race it.
    if dispositions
        .iter()
        .any(|d| matches!(d, Disposition::Defer(_)))
    {
        l.gate.send_modify(|g| g.quiesced = true);
    }
    let step = || l.pulse.beat();
    let delays = settle_all(&l.subscription, &l.events, live, dispositions, &step).await;
    l.depth.handed_back_after(&delays);
    Some(delays.into_iter().max().unwrap_or_default())
}

/// Settle each delivery as its handler answered (a missing answer hands
/// it back): the delay of each one handed back with a delay.
/// `settled_one` is called before each settle: the dispatch loop's beat, so
/// a batch whose settles each answer within their bound keeps the loop
/// alive however many there are (chaos ci profile under load: a seat loop
/// acknowledged a batch of coalesced mail at about 0.7 s an ack, went
/// 3.4 s without a beat, and its watchdog shot a healthy node, exit 75),
/// while one settle that outlives its bound still stops the beat.
async fn settle_all(
    subscription: &str,
    events: &EventSink,
    live: Vec<(Delivery, Box<dyn Settle>)>,
    dispositions: Vec<Disposition>,
    settled_one: &(dyn Fn() + Sync),
) -> Vec<Duration> {
    let mut delays = Vec::new();
    for (i, (delivery, settle)) in live.into_iter().enumerate() {
        settled_one();
        let (subject, seq) = (delivery.subject.clone(), delivery.seq);
        let d = &delivery;
        match dispositions.get(i).cloned().unwrap_or(Disposition::Nak) {
            Disposition::Ack => settled("ack", subscription, d, settle.ack().await).await,
            Disposition::Nak => settled("nak", subscription, d, settle.nak().await).await,
            Disposition::Retry(delay) if delay.is_zero() => {
                settled("nak", subscription, d, settle.nak().await).await
            }
            Disposition::Retry(delay) => {
                delays.push(delay);
                let what = format!("retry {delay:?}");
                settled(&what, subscription, d, settle.nak_after(delay).await).await;
            }
            Disposition::Defer(reason) => {
                let what = format!("defer: {reason}");
                settled(&what, subscription, d, settle.nak().await).await;
                (events)(QueueEvent::Deferred {
                    subscription: subscription.to_string(),
                    subject,
                    seq,
                    reason,
                });
            }
            Disposition::Poison(why) => {
                dead_letter_in(
                    subscription,
                    events,
                    &delivery,
                    settle,
                    DeadLetterReason::Poison(why),
                )
                .await;
            }
        }
    }
    delays
}

async fn dead_letter(l: &Loop, d: &Delivery, settle: Box<dyn Settle>, reason: DeadLetterReason) {
    dead_letter_in(&l.subscription, &l.events, d, settle, reason).await
}

async fn dead_letter_in(
    subscription: &str,
    events: &EventSink,
    d: &Delivery,
    settle: Box<dyn Settle>,
    reason: DeadLetterReason,
) {
    let result = settle.dead_letter(&reason).await;
    match &result {
        Ok(()) => trace("dead_lettered", subscription, d, &reason.to_string()),
        Err(e) => trace("dead_lettered", subscription, d, &format!("failed: {e}")),
    }
    match result {
        Ok(()) => (events)(QueueEvent::DeadLettered {
            subscription: subscription.to_string(),
            subject: d.subject.clone(),
            seq: d.seq,
            delivered: d.delivered,
            reason,
        }),
        Err(e) => {
            // Not copied, so not removed: it stays in the subscription and
            // the next delivery tries again.
            tracing::error!(subscription = %subscription, seq = d.seq, error = %e, "cannot dead-letter a message; it stays queued");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A source that fetches nothing and has seen `reasons`.
    struct Reasons(std::sync::atomic::AtomicU64);

    #[async_trait::async_trait]
    impl Source for Reasons {
        async fn next(&self, _wait: Duration) -> Result<Option<Fetched>, QueueError> {
            Ok(None)
        }
        fn reasons(&self) -> u64 {
            self.0.load(std::sync::atomic::Ordering::SeqCst)
        }
        fn look_offset(&self) -> Duration {
            Duration::from_millis(700)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn each_new_reason_makes_a_stranded_look_due_once_acknowledgements_have_landed_at_the_loops_offset()
     {
        let source = Reasons(Default::default());
        let mut seen = source.reasons();
        let now = tokio::time::Instant::now();
        let later = now + Duration::from_secs(300);
        assert_eq!(
            due_with_reasons(&source, &mut seen, later),
            later,
            "no reason yet"
        );
        source.0.store(2, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(
            due_with_reasons(&source, &mut seen, later),
            now + STRANDED_AFTER_ERROR + Duration::from_millis(700),
            "after acknowledgements have landed, at the loop's own offset"
        );
        assert_eq!(seen, 2);
        assert_eq!(
            due_with_reasons(&source, &mut seen, later),
            later,
            "counted once"
        );
        let sooner = now + Duration::from_millis(1);
        source.0.store(3, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(
            due_with_reasons(&source, &mut seen, sooner),
            sooner,
            "never later than due"
        );
    }

    /// The trace is what tells a message's story from the nodes' logs
    /// (the chaos checker reads it): each step names the subscription, the
    /// stream sequence, the delivery count and the message id.
    #[test]
    fn every_step_of_a_delivery_is_traced_with_its_subscription_sequence_count_and_id() {
        use crate::queue::twin::TwinQueue;
        use crate::queue::{Queue, QueueSettings, SubscriptionSpec, handler_fn};
        let told = crate::logging::logged(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(async {
                let q = TwinQueue::new(Arc::new(|_| {}));
                let specs = SubscriptionSpec::seat("traced", QueueSettings::default());
                for spec in &specs {
                    q.ensure_subscription(spec).await.expect("a subscription");
                }
                let inbox = &specs[0];
                q.publish(
                    &inbox.subject,
                    Some("m-traced"),
                    bytes::Bytes::from_static(b"x"),
                )
                .await
                .expect("published");
                let ack = handler_fn(|_| async { Disposition::Ack });
                let a = q.attach(&inbox.name, &[], ack).await.expect("attached");
                let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
                while q.pending(&inbox.name).await.expect("pending") > 0 {
                    assert!(tokio::time::Instant::now() < deadline, "never acknowledged");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                a.detach().await;
            });
        });
        let steps: Vec<&str> = told
            .lines()
            .filter(|l| l.contains("crewlet::delivery") && l.contains("msg_id=\"m-traced\""))
            .collect();
        assert_eq!(steps.len(), 2, "fetched, then settled:\n{told}");
        for (line, step, what) in [(steps[0], "fetched", "fetch"), (steps[1], "settled", "ack")] {
            for field in [
                format!("step=\"{step}\""),
                "subscription=\"agent-traced\"".to_string(),
                "seq=1".to_string(),
                "delivered=1".to_string(),
                format!("what=\"{what}\""),
            ] {
                assert!(line.contains(&field), "{field} missing from: {line}");
            }
        }
    }

    /// One message, then nothing; every stranded-mail look is recorded
    /// with the idle time the loop gave it.
    struct OneThenQuiet {
        first: Mutex<Option<Delivery>>,
        looks: Arc<Mutex<Vec<(tokio::time::Instant, Duration)>>>,
        /// When the delivery was handed back with a delay.
        delayed: Arc<Mutex<Option<tokio::time::Instant>>>,
    }

    struct Settled(Arc<Mutex<Option<tokio::time::Instant>>>);

    #[async_trait::async_trait]
    impl Settle for Settled {
        async fn ack(self: Box<Self>) -> Result<(), QueueError> {
            Ok(())
        }
        async fn nak(self: Box<Self>) -> Result<(), QueueError> {
            Ok(())
        }
        async fn nak_after(self: Box<Self>, _delay: Duration) -> Result<(), QueueError> {
            *self.0.lock().unwrap() = Some(tokio::time::Instant::now());
            Ok(())
        }
        async fn dead_letter(
            self: Box<Self>,
            _reason: &DeadLetterReason,
        ) -> Result<(), QueueError> {
            Ok(())
        }
    }

    #[async_trait::async_trait]
    impl Source for OneThenQuiet {
        async fn next(&self, wait: Duration) -> Result<Option<Fetched>, QueueError> {
            let first = self.first.lock().unwrap().take();
            match first {
                Some(delivery) => Ok(Some(Fetched {
                    delivery,
                    settle: Box::new(Settled(self.delayed.clone())),
                })),
                None => {
                    tokio::time::sleep(wait).await;
                    Ok(None)
                }
            }
        }
        async fn take_stranded(
            &self,
            _judge: &dyn Handler,
            idle: Duration,
            _beat: &Progress<'_>,
        ) -> Result<Option<Vec<Fetched>>, QueueError> {
            self.looks
                .lock()
                .unwrap()
                .push((tokio::time::Instant::now(), idle));
            Ok(None)
        }
    }

    /// A delivery this loop handed back with a delay is its own, due back
    /// then: until it is due, no look for stranded mail is told the loop
    /// was idle, so a retry's backoff is never cut short by taking its
    /// mail from the stream.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_loop_is_not_idle_while_a_delivery_it_handed_back_with_a_delay_is_due() {
        let delay = Duration::from_secs(60);
        let looks = Arc::new(Mutex::new(Vec::new()));
        let delayed = Arc::new(Mutex::new(None));
        let source = Arc::new(OneThenQuiet {
            first: Mutex::new(Some(Delivery {
                subscription: "agent-s".into(),
                subject: "crewlet.agent.s.inbox".into(),
                payload: bytes::Bytes::from_static(b"x"),
                delivered: 1,
                msg_id: None,
                seq: 1,
            })),
            looks: looks.clone(),
            delayed: delayed.clone(),
        });
        let handler = super::super::handler_fn(move |_| async move { Disposition::Retry(delay) });
        let a = Attachment::start("agent-s".into(), 25, &[], source, handler, Arc::new(|_| {}));
        tokio::time::sleep(delay * 2).await;
        a.detach().await;
        let handed_back = delayed
            .lock()
            .unwrap()
            .expect("the delivery was handed back with its delay");
        let looks = looks.lock().unwrap();
        let during: Vec<_> = looks
            .iter()
            .filter(|(at, _)| *at > handed_back && *at < handed_back + delay)
            .collect();
        assert!(
            !during.is_empty(),
            "the loop looked while the retry was due: {looks:?}"
        );
        assert!(
            during.iter().all(|(_, idle)| idle.is_zero()),
            "a look was told the loop was idle before its own retry was due: {during:?}"
        );
        assert!(
            looks.iter().any(
                |(at, idle)| *at > handed_back + delay + STRANDED_AFTER_ERROR && !idle.is_zero()
            ),
            "once the retry was due, the loop counted as idle again: {looks:?}"
        );
    }

    /// Nothing to fetch, a long pull (a minute), and every look for
    /// stranded mail answered "not now" (a delivery awaits its
    /// acknowledgement); each look's instant is recorded.
    struct LongPullPending {
        looks: Arc<Mutex<Vec<tokio::time::Instant>>>,
    }

    #[async_trait::async_trait]
    impl Source for LongPullPending {
        async fn next(&self, wait: Duration) -> Result<Option<Fetched>, QueueError> {
            tokio::time::sleep(wait).await;
            Ok(None)
        }
        fn fetch_wait(&self) -> Duration {
            Duration::from_secs(60)
        }
        async fn take_stranded(
            &self,
            _judge: &dyn Handler,
            _idle: Duration,
            _beat: &Progress<'_>,
        ) -> Result<Option<Vec<Fetched>>, QueueError> {
            self.looks.lock().unwrap().push(tokio::time::Instant::now());
            Ok(None)
        }
    }

    /// A look that could not go ahead asks again in STRANDED_AFTER_ERROR,
    /// and a long pull does not put it off until the pull comes back.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_look_put_off_by_a_pending_delivery_is_not_put_off_again_by_a_long_pull() {
        let looks = Arc::new(Mutex::new(Vec::new()));
        let source = Arc::new(LongPullPending {
            looks: looks.clone(),
        });
        let handler = super::super::handler_fn(|_| async { Disposition::Ack });
        let a = Attachment::start("agent-s".into(), 25, &[], source, handler, Arc::new(|_| {}));
        tokio::time::sleep(Duration::from_secs(60)).await;
        a.detach().await;
        let looks = looks.lock().unwrap();
        assert!(
            looks.len() >= 20,
            "a look every {STRANDED_AFTER_ERROR:?} over a minute: {} looks",
            looks.len()
        );
        let slack = STRANDED_AFTER_ERROR + MIN_FETCH_WAIT;
        assert!(
            looks.windows(2).all(|w| w[1] - w[0] <= slack),
            "no look waited for the pull: {looks:?}"
        );
    }

    /// A broker slow to answer, each call within its own bound: every
    /// fetch takes `fetch`, every acknowledgement `ack` (counted in
    /// `acked`); `left` deliveries, then nothing.
    struct SlowBroker {
        left: std::sync::atomic::AtomicU64,
        fetch: Duration,
        ack: Duration,
        acked: Arc<std::sync::atomic::AtomicU64>,
    }

    impl SlowBroker {
        fn new(left: u64, fetch: Duration, ack: Duration) -> SlowBroker {
            SlowBroker {
                left: std::sync::atomic::AtomicU64::new(left),
                fetch,
                ack,
                acked: Arc::new(std::sync::atomic::AtomicU64::new(0)),
            }
        }
    }

    #[async_trait::async_trait]
    impl Source for SlowBroker {
        async fn next(&self, wait: Duration) -> Result<Option<Fetched>, QueueError> {
            use std::sync::atomic::Ordering::SeqCst;
            let seq = self.left.load(SeqCst);
            if seq == 0 {
                tokio::time::sleep(wait).await;
                return Ok(None);
            }
            tokio::time::sleep(self.fetch).await;
            self.left.store(seq - 1, SeqCst);
            Ok(Some(Fetched {
                delivery: Delivery {
                    subscription: "agent-s".into(),
                    subject: "crewlet.agent.s.inbox".into(),
                    payload: bytes::Bytes::from_static(b"x"),
                    delivered: 1,
                    msg_id: None,
                    seq,
                },
                settle: Box::new(SlowAck {
                    each: self.ack,
                    acked: self.acked.clone(),
                }),
            }))
        }
        async fn take_stranded(
            &self,
            _judge: &dyn Handler,
            _idle: Duration,
            _beat: &Progress<'_>,
        ) -> Result<Option<Vec<Fetched>>, QueueError> {
            Ok(None)
        }
    }

    /// Takes up to eight deliveries at once and answers each.
    struct Batches;

    #[async_trait::async_trait]
    impl Handler for Batches {
        async fn handle(&self, _d: Delivery) -> Disposition {
            Disposition::Ack
        }
        fn batch_limit(&self) -> usize {
            8
        }
    }

    /// Attach a batch handler to `source` and watch the loop's beat until
    /// `done` (five slow calls of `each` and a margin at most, else the
    /// test fails naming `what` it waited for): the longest the loop went
    /// without a beat.
    async fn longest_silence(
        source: Arc<dyn Source>,
        each: Duration,
        what: &str,
        done: impl Fn() -> bool,
    ) -> Duration {
        let a = Attachment::start(
            "agent-s".into(),
            25,
            &[],
            source,
            Arc::new(Batches),
            Arc::new(|_| {}),
        );
        let pulse = a.pulse();
        let deadline = std::time::Instant::now() + each * 5 + Duration::from_secs(5);
        let mut longest = Duration::ZERO;
        while !done() {
            assert!(
                std::time::Instant::now() < deadline,
                "timed out waiting for {what}"
            );
            longest = longest.max(pulse.silent_for());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        a.detach().await;
        longest
    }

    /// The loop coalescing a batch from a broker slow to answer each fetch
    /// (each within its bound, together far past the lease TTL) beats all
    /// along: a healthy node is never taken for wedged by its watchdog.
    #[tokio::test]
    async fn a_loop_coalescing_a_batch_from_a_slow_broker_keeps_beating() {
        let each = Duration::from_millis(750);
        let source = Arc::new(SlowBroker::new(5, each, Duration::ZERO));
        let left = source.clone();
        let longest = longest_silence(source, each, "the slow broker's deliveries fetched", || {
            left.left.load(std::sync::atomic::Ordering::SeqCst) == 0
        })
        .await;
        assert!(
            longest < each * 2,
            "the loop went {longest:?} without a beat while it fetched (each fetch {each:?})"
        );
    }

    /// A broker whose stranded-mail look makes `steps` calls, each
    /// answered `each` later (within its bound), beating before each as a
    /// look does; nothing ever arrives.
    struct SlowLook {
        steps: usize,
        each: Duration,
        looked: std::sync::atomic::AtomicBool,
    }

    #[async_trait::async_trait]
    impl Source for SlowLook {
        async fn next(&self, _wait: Duration) -> Result<Option<Fetched>, QueueError> {
            // Nothing ever arrives: the fetch waits until the loop is detached.
            std::future::pending().await
        }
        async fn take_stranded(
            &self,
            _judge: &dyn Handler,
            _idle: Duration,
            beat: &Progress<'_>,
        ) -> Result<Option<Vec<Fetched>>, QueueError> {
            if !self.looked.load(std::sync::atomic::Ordering::SeqCst) {
                for _ in 0..self.steps {
                    beat();
                    tokio::time::sleep(self.each).await;
                }
                self.looked.store(true, std::sync::atomic::Ordering::SeqCst);
            }
            Ok(Some(Vec::new()))
        }
    }

    /// The look for stranded mail a loop makes when it attaches, on a broker
    /// slow to answer each of its calls (each within its bound, together
    /// past the lease TTL), beats all along (chaos ci profile under load:
    /// a loop silent 3.2 s in its attach-time look, and its watchdog shot a
    /// healthy node, exit 75).
    #[tokio::test]
    async fn a_loop_looking_for_stranded_mail_on_a_slow_broker_keeps_beating() {
        let each = Duration::from_millis(750);
        let source = Arc::new(SlowLook {
            steps: 5,
            each,
            looked: Default::default(),
        });
        let look = source.clone();
        let longest = longest_silence(source, each, "the look finished", || {
            look.looked.load(std::sync::atomic::Ordering::SeqCst)
        })
        .await;
        assert!(
            longest < each * 2,
            "the loop went {longest:?} without a beat while it looked (each call {each:?})"
        );
    }

    /// A settle the broker answers slowly, each within its bound; counts
    /// the acknowledgements that landed.
    struct SlowAck {
        each: Duration,
        acked: Arc<std::sync::atomic::AtomicU64>,
    }

    #[async_trait::async_trait]
    impl Settle for SlowAck {
        async fn ack(self: Box<Self>) -> Result<(), QueueError> {
            tokio::time::sleep(self.each).await;
            self.acked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        }
        async fn nak(self: Box<Self>) -> Result<(), QueueError> {
            Ok(())
        }
        async fn nak_after(self: Box<Self>, _delay: Duration) -> Result<(), QueueError> {
            Ok(())
        }
        async fn dead_letter(
            self: Box<Self>,
            _reason: &DeadLetterReason,
        ) -> Result<(), QueueError> {
            Ok(())
        }
    }

    /// The loop settling a batch on a broker slow to answer each
    /// acknowledgement (each within its bound, together far past the
    /// lease TTL) beats all along: a healthy node is never taken for
    /// wedged by its watchdog.
    #[tokio::test]
    async fn a_loop_settling_a_batch_on_a_slow_broker_keeps_beating() {
        use std::sync::atomic::Ordering::SeqCst;
        let each = Duration::from_millis(750);
        let source = Arc::new(SlowBroker::new(5, Duration::ZERO, each));
        let acked = source.acked.clone();
        let longest = longest_silence(source, each, "the batch all acknowledged", || {
            acked.load(SeqCst) >= 5
        })
        .await;
        assert!(
            longest < each * 2,
            "the loop went {longest:?} without a beat while it settled (each ack {each:?})"
        );
    }
}
