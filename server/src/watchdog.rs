//! The watchdog: a node whose loops stop turning leaves, with exit code 75
//! (spec § The wedged node).
//!
//! Each watched loop stamps a beat as it turns; a plain OS thread (not a
//! task: a wedged runtime must not be able to stop it) compares the beats
//! with the threshold — the lease TTL in force, adopted or configured, never
//! a knob of its own — and, past it, writes one line straight to stderr
//! (not through the logger) and calls `std::process::exit(75)`. It is
//! disarmed for the whole of a graceful shutdown, and it stands down when
//! nothing it watches is live any more: a loop that finished took its work
//! with it. The decision is the pure [`verdict`].
//!
//! A loop in a lower layer (a seat's turn dispatch in the queue) carries a
//! [`Pulse`] of its own, knowing nothing of the watchdog, and the layer that
//! started it has the watchdog [`Watchdog::follow`] it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The exit code of a wedged node.
pub const EXIT_WEDGED: i32 = 75;

/// What the watcher concludes from the beats.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Healthy,
    /// Nothing watched is live any more.
    StandDown,
    /// `loop_name` has not beaten for `lag`.
    Wedged {
        loop_name: String,
        lag: Duration,
    },
}

/// The beat of one loop: when it last turned, and whether it is still live.
#[derive(Clone, Copy, Debug)]
pub struct Beat {
    pub at: Instant,
    pub live: bool,
}

/// Pure: the verdict at `now` for `beats` against `threshold`.
pub fn verdict(now: Instant, beats: &BTreeMap<String, Beat>, threshold: Duration) -> Verdict {
    let live: Vec<(&String, &Beat)> = beats.iter().filter(|(_, b)| b.live).collect();
    if live.is_empty() {
        return Verdict::StandDown;
    }
    live.into_iter()
        .map(|(n, b)| (n, now.saturating_duration_since(b.at)))
        .filter(|(_, lag)| *lag > threshold)
        .max_by_key(|(_, lag)| *lag)
        .map_or(Verdict::Healthy, |(n, lag)| Verdict::Wedged {
            loop_name: n.clone(),
            lag,
        })
}

/// How often a loop must stamp, at most: a third of the threshold.
pub fn stamp_interval(threshold: Duration) -> Duration {
    (threshold / 3).max(Duration::from_millis(10))
}

/// The one beat a long step calls as each part of it settles: the caller's
/// watchdog beat (`|| pulse.beat()`, `|| watchdog.beat(name)`), or `&|| {}`
/// when nobody watches. Every `*_with(progress)` takes one.
pub type Progress<'a> = dyn Fn() + Sync + 'a;

/// Await `fut`, calling `beat` every `every` while it waits — for at most
/// `bound` when given (then the beats stop and the wait goes on, so a wait
/// past its bound reads as a loop that stopped turning).
pub async fn beat_while<F: std::future::Future>(
    beat: &Progress<'_>,
    every: Duration,
    bound: Option<Duration>,
    fut: F,
) -> F::Output {
    tokio::pin!(fut);
    let until = bound.map(|b| tokio::time::Instant::now() + b);
    loop {
        if until.is_some_and(|u| tokio::time::Instant::now() >= u) {
            return fut.await;
        }
        beat();
        tokio::select! {
            out = &mut fut => return out,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

/// How often the watcher looks: a quarter of the threshold.
pub fn poll_interval(threshold: Duration) -> Duration {
    (threshold / 4).max(Duration::from_millis(10))
}

/// Pure: whether the watcher, asleep since `slept_at` for `poll`, woke so
/// late (by a whole `poll` more) that the process itself was held — stopped
/// or starved of the CPU as a whole. Its loops were held with it and had no
/// chance to beat: the watcher then looks again one poll later instead of
/// reading the pause as a wedge — once; a watcher held poll after poll
/// judges all the same (a node starved that long cannot renew either).
pub fn watcher_was_held(slept_at: Instant, poll: Duration, now: Instant) -> bool {
    now.saturating_duration_since(slept_at) >= poll * 2
}

/// Pure: the line a wedged node leaves on stderr — the loop, its lag, the
/// threshold, and the other live loops that lag most (a wedge of one loop
/// reads differently from a process that stalled as a whole).
pub fn wedged_line(
    loop_name: &str,
    lag: Duration,
    threshold: Duration,
    beats: &BTreeMap<String, Beat>,
    now: Instant,
) -> String {
    let mut others: Vec<(Duration, &String)> = beats
        .iter()
        .filter(|(n, b)| b.live && n.as_str() != loop_name)
        .map(|(n, b)| (now.saturating_duration_since(b.at), n))
        .collect();
    others.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    let shown: Vec<String> = others
        .iter()
        .take(5)
        .map(|(l, n)| format!("{n} {:.1}s", l.as_secs_f64()))
        .collect();
    let more = match others.len() {
        n if n > 5 => format!(", and {} more", n - 5),
        _ => String::new(),
    };
    format!(
        "crewlet watchdog: the {loop_name} loop has not turned for {:.1}s (threshold {:.1}s = the lease TTL); this node no longer provably owns its seats. Exiting with code {EXIT_WEDGED}. The other loops last turned: {}{more}.",
        lag.as_secs_f64(),
        threshold.as_secs_f64(),
        if shown.is_empty() {
            "none live".to_string()
        } else {
            shown.join(", ")
        }
    )
}

/// A loop's beat that the loop carries itself. It is live until
/// [`Pulse::end`] (the loop's own end) and beats as the loop turns.
///
/// A loop waiting on something allowed to take as long as it takes (a
/// closed gate, a fetch bounded by construction, the turn it dispatched)
/// says so with [`Pulse::waiting`] instead of beating on a timer while it
/// waits: the watcher reads a waiting loop as turning. A thousand idle
/// seats' loops then cost the process no wake-up at all between fetches
/// (they cost two a second each when each waiting loop beat every half
/// second); the node's own loops (the heartbeat, the sweep) still beat on
/// their timers, so a runtime that stops running tasks is still seen.
#[derive(Clone)]
pub struct Pulse(Arc<PulseState>);

struct PulseState {
    at: Mutex<Instant>,
    live: AtomicBool,
    /// Waits under way ([`Pulse::waiting`]); the loop turns while any is.
    waits: AtomicUsize,
}

impl Default for Pulse {
    fn default() -> Pulse {
        Pulse::new()
    }
}

impl Pulse {
    pub fn new() -> Pulse {
        Pulse(Arc::new(PulseState {
            at: Mutex::new(Instant::now()),
            live: AtomicBool::new(true),
            waits: AtomicUsize::new(0),
        }))
    }

    /// Await `fut`, a wait the loop may make for as long as it takes: the
    /// loop reads as turning until it ends (or is dropped), then beats.
    pub async fn waiting<F: std::future::Future>(&self, fut: F) -> F::Output {
        self.0.waits.fetch_add(1, Ordering::SeqCst);
        let _done = WaitEnd(self);
        fut.await
    }

    /// The loop turned.
    pub fn beat(&self) {
        *self.0.at.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    /// The loop ended: nothing is watched here any more.
    pub fn end(&self) {
        self.0.live.store(false, Ordering::SeqCst);
    }

    /// How long since the loop last turned.
    pub fn silent_for(&self) -> Duration {
        self.read().at.elapsed()
    }

    pub fn is_live(&self) -> bool {
        self.0.live.load(Ordering::SeqCst)
    }

    /// A guard that ends this pulse when dropped: the task carrying it
    /// finished, or was cancelled.
    pub fn end_on_drop(&self) -> PulseEnd {
        PulseEnd(self.clone())
    }

    fn read(&self) -> Beat {
        let waiting = self.0.waits.load(Ordering::SeqCst) > 0;
        Beat {
            at: if waiting {
                Instant::now()
            } else {
                *self.0.at.lock().unwrap_or_else(|e| e.into_inner())
            },
            live: self.is_live(),
        }
    }
}

/// Ends one wait of a [`Pulse`] when dropped (the wait finished, or the
/// future awaiting it was dropped), and beats.
struct WaitEnd<'a>(&'a Pulse);

impl Drop for WaitEnd<'_> {
    fn drop(&mut self) {
        self.0.beat();
        self.0.0.waits.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Ends its [`Pulse`] when dropped.
pub struct PulseEnd(Pulse);

impl Drop for PulseEnd {
    fn drop(&mut self) {
        self.0.end();
    }
}

struct Inner {
    beats: Mutex<BTreeMap<String, Beat>>,
    /// Pulses followed, by loop name (an ended one is dropped at the next
    /// look).
    followed: Mutex<Vec<(String, Pulse)>>,
    threshold: Duration,
    armed: AtomicBool,
    stopped: AtomicBool,
}

/// The watchdog. Clones share it.
#[derive(Clone)]
pub struct Watchdog {
    inner: Arc<Inner>,
}

impl Watchdog {
    pub fn new(threshold: Duration) -> Watchdog {
        Watchdog {
            inner: Arc::new(Inner {
                beats: Mutex::new(BTreeMap::new()),
                followed: Mutex::new(Vec::new()),
                threshold,
                armed: AtomicBool::new(true),
                stopped: AtomicBool::new(false),
            }),
        }
    }

    pub fn threshold(&self) -> Duration {
        self.inner.threshold
    }

    /// `name` turned.
    pub fn beat(&self, name: &str) {
        let mut b = self.inner.beats.lock().unwrap_or_else(|e| e.into_inner());
        b.insert(
            name.to_string(),
            Beat {
                at: Instant::now(),
                live: true,
            },
        );
    }

    /// `name` finished: it is no longer watched.
    pub fn retire(&self, name: &str) {
        let mut b = self.inner.beats.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(beat) = b.get_mut(name) {
            beat.live = false;
        }
    }

    /// Beat for `name` now and retire it when the returned guard drops
    /// (the loop ended, or its task was cancelled).
    pub fn watch(&self, name: &str) -> BeatGuard {
        self.beat(name);
        BeatGuard {
            dog: self.clone(),
            name: name.to_string(),
        }
    }

    /// A graceful shutdown began: never fire again.
    pub fn disarm(&self) {
        self.inner.armed.store(false, Ordering::SeqCst);
    }

    /// Watch the loop that carries `pulse`, as `name`, until it ends.
    pub fn follow(&self, name: &str, pulse: Pulse) {
        self.inner
            .followed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((name.to_string(), pulse));
    }

    /// Every loop watched now, with its beat (ended ones included until
    /// the next look drops them).
    pub fn beats(&self) -> BTreeMap<String, Beat> {
        let mut all = self
            .inner
            .beats
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut followed = self
            .inner
            .followed
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        followed.retain(|(_, p)| p.is_live());
        for (name, p) in followed.iter() {
            all.insert(name.clone(), p.read());
        }
        all
    }

    pub fn current(&self) -> Verdict {
        verdict(Instant::now(), &self.beats(), self.inner.threshold)
    }

    /// Start the watcher thread. It exits the process on a wedged verdict
    /// while armed, and ends when disarmed or when nothing is live.
    pub fn spawn(&self) -> std::io::Result<()> {
        let me = self.clone();
        std::thread::Builder::new()
            .name("crewlet-watchdog".into())
            .spawn(move || {
                let poll = poll_interval(me.inner.threshold);
                // A held wake is forgiven once: a process starved poll after
                // poll is judged all the same.
                let mut forgave = false;
                loop {
                    let slept_at = Instant::now();
                    std::thread::sleep(poll);
                    if !me.inner.armed.load(Ordering::SeqCst)
                        || me.inner.stopped.load(Ordering::SeqCst)
                    {
                        return;
                    }
                    let held = watcher_was_held(slept_at, poll, Instant::now());
                    if held && !forgave {
                        forgave = true;
                        continue;
                    }
                    forgave = false;
                    let (now, beats) = (Instant::now(), me.beats());
                    match verdict(now, &beats, me.inner.threshold) {
                        Verdict::Healthy => {}
                        Verdict::StandDown => return,
                        Verdict::Wedged { loop_name, lag } => {
                            if !me.inner.armed.load(Ordering::SeqCst) {
                                return;
                            }
                            use std::io::Write;
                            let line =
                                wedged_line(&loop_name, lag, me.inner.threshold, &beats, now);
                            let _ = writeln!(std::io::stderr(), "{line}");
                            std::process::exit(EXIT_WEDGED);
                        }
                    }
                }
            })
            .map(|_| ())
    }

    /// Stop the watcher thread without exiting (tests, and engines that are
    /// torn down without a process exit).
    pub fn stop(&self) {
        self.inner.stopped.store(true, Ordering::SeqCst);
    }
}

/// Retires a loop's beat when dropped.
pub struct BeatGuard {
    dog: Watchdog,
    name: String,
}

impl BeatGuard {
    pub fn beat(&self) {
        self.dog.beat(&self.name);
    }
}

impl Drop for BeatGuard {
    fn drop(&mut self) {
        self.dog.retire(&self.name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Wait, under a deadline, until `pulse` has `n` waits under way.
    async fn until_waits(pulse: &Pulse, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while pulse.0.waits.load(Ordering::SeqCst) != n {
            assert!(Instant::now() < deadline, "never {n} waits under way");
            tokio::task::yield_now().await;
        }
    }

    /// A loop waiting (a fetch, a closed gate, its turn) reads as turning
    /// however long the wait, with no timer beating for it; it beats as the
    /// wait ends, and a wait whose future is dropped (the loop cancelled)
    /// ends too — after which silence counts again.
    #[tokio::test]
    async fn a_waiting_loop_reads_as_turning_and_beats_when_the_wait_ends() {
        let quiet = Duration::from_millis(60);
        let pulse = Pulse::new();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let p = pulse.clone();
        let wait = tokio::spawn(async move { p.waiting(rx).await });
        until_waits(&pulse, 1).await;
        std::thread::sleep(quiet);
        assert!(pulse.silent_for() < quiet, "a waiting loop is turning");
        tx.send(()).expect("the wait listens");
        wait.await
            .expect("the wait ends")
            .expect("it got its answer");
        until_waits(&pulse, 0).await;
        assert!(pulse.silent_for() < quiet, "the end of the wait is a beat");
        std::thread::sleep(quiet);
        assert!(
            pulse.silent_for() >= quiet,
            "once the wait is over, silence counts"
        );
        let p = pulse.clone();
        let dropped = tokio::spawn(async move { p.waiting(std::future::pending::<()>()).await });
        until_waits(&pulse, 1).await;
        dropped.abort();
        until_waits(&pulse, 0).await;
    }

    fn beats(v: &[(&str, u64, bool)], now: Instant) -> BTreeMap<String, Beat> {
        v.iter()
            .map(|(n, ago, live)| {
                (
                    n.to_string(),
                    Beat {
                        at: now - Duration::from_millis(*ago),
                        live: *live,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn a_loop_quiet_past_the_lease_ttl_is_wedged() {
        let now = Instant::now() + Duration::from_secs(100);
        let b = beats(&[("sweep", 46_000, true), ("heartbeat", 1_000, true)], now);
        assert_eq!(
            verdict(now, &b, Duration::from_secs(45)),
            Verdict::Wedged {
                loop_name: "sweep".into(),
                lag: Duration::from_secs(46)
            }
        );
    }

    #[test]
    fn a_watcher_that_woke_a_whole_poll_late_looks_again_before_judging() {
        let poll = Duration::from_millis(750);
        let slept = Instant::now();
        assert!(!watcher_was_held(slept, poll, slept + poll));
        assert!(!watcher_was_held(slept, poll, slept + poll + poll / 2));
        assert!(watcher_was_held(slept, poll, slept + poll * 2));
        assert!(watcher_was_held(
            slept,
            poll,
            slept + Duration::from_secs(30)
        ));
    }

    #[test]
    fn the_wedged_line_names_the_loop_and_the_others_that_lag_most() {
        let now = Instant::now() + Duration::from_secs(100);
        let b = beats(
            &[
                ("dispatch:s1", 3_200, true),
                ("heartbeat", 3_100, true),
                ("sweep", 200, true),
                ("gone", 9_000, false),
            ],
            now,
        );
        let line = wedged_line(
            "dispatch:s1",
            Duration::from_millis(3_200),
            Duration::from_secs(3),
            &b,
            now,
        );
        assert!(
            line.starts_with(
                "crewlet watchdog: the dispatch:s1 loop has not turned for 3.2s (threshold 3.0s"
            ),
            "{line}"
        );
        assert!(
            line.ends_with("The other loops last turned: heartbeat 3.1s, sweep 0.2s."),
            "{line}"
        );
        assert!(!line.contains("gone"), "{line}");
    }

    #[test]
    fn beats_within_the_threshold_are_healthy() {
        let now = Instant::now() + Duration::from_secs(100);
        let b = beats(&[("sweep", 44_000, true), ("heartbeat", 1_000, true)], now);
        assert_eq!(verdict(now, &b, Duration::from_secs(45)), Verdict::Healthy);
    }

    #[test]
    fn a_loop_that_finished_is_not_a_loop_that_is_wedged() {
        let now = Instant::now() + Duration::from_secs(100);
        let b = beats(&[("sweep", 90_000, false), ("heartbeat", 1_000, true)], now);
        assert_eq!(verdict(now, &b, Duration::from_secs(45)), Verdict::Healthy);
        let b = beats(
            &[("sweep", 90_000, false), ("heartbeat", 90_000, false)],
            now,
        );
        assert_eq!(
            verdict(now, &b, Duration::from_secs(45)),
            Verdict::StandDown
        );
        assert_eq!(
            verdict(now, &BTreeMap::new(), Duration::from_secs(45)),
            Verdict::StandDown
        );
    }

    #[test]
    fn a_loop_whose_task_ended_stands_the_watchdog_down() {
        let dog = Watchdog::new(Duration::from_secs(45));
        {
            let g = dog.watch("sweep");
            g.beat();
            assert_eq!(dog.current(), Verdict::Healthy);
        }
        assert_eq!(dog.current(), Verdict::StandDown);
    }

    #[test]
    fn a_followed_loop_that_stops_beating_is_wedged_and_one_that_ended_is_not_watched() {
        let t = Duration::from_secs(45);
        let dog = Watchdog::new(t);
        let turns = Pulse::new();
        dog.follow("dispatch:s0", turns.clone());
        let later = Instant::now() + t * 2;
        assert!(
            matches!(verdict(later, &dog.beats(), t), Verdict::Wedged { loop_name, .. } if loop_name == "dispatch:s0")
        );
        turns.end();
        assert_eq!(verdict(later, &dog.beats(), t), Verdict::StandDown);
        assert!(dog.beats().is_empty(), "an ended pulse is dropped");
    }

    #[test]
    fn cadences_are_ceilings_derived_from_the_threshold() {
        let t = Duration::from_secs(45);
        assert_eq!(stamp_interval(t), Duration::from_secs(15));
        assert!(poll_interval(t) < t);
        // A threshold of 3 s (tests) still gives a healthy node room.
        assert!(stamp_interval(Duration::from_secs(3)) * 2 < Duration::from_secs(3));
    }
}
