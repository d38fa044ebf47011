//! The watchdog. As a process: a node whose sweep loop blocks forever exits
//! with code 75, after one line on stderr, once the lease TTL has passed
//! (spec § The wedged node). A node stopped gracefully exits 0 (cli.rs).
//!
//! And, read from inside a seat engine, what is not a wedged loop: a loop
//! whose bounded steps keep returning, however slowly — a heartbeat against
//! a store that stopped answering, a sweep pass claiming seat after seat, a
//! claim whose hook fails and hands the seat back. All three were found by
//! the chaos harness (a NATS leader restart took every node of a fleet down
//! with exit 75).

use crate::support;
use crate::support::faulty::{Call, Faults, Faulty};

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crewlet::config::{PlacementConfig, RoleConfig};
use crewlet::coord::{
    Claim, ClaimRequest, Coordinator, CoordinatorOptions, Renewal, StateBucket, Store, StoreError,
    TwinBackend,
};
use crewlet::events::EventBus;
use crewlet::node::company;
use crewlet::queue::twin::TwinQueue;
use crewlet::queue::{
    Delivery, Disposition, Handler, Queue, QueueSettings, handler_fn, log_events,
};
use crewlet::seat::engine::{EngineConfig, SeatEngine};
use crewlet::seat::host::{Fence, HookError, Phase, SeatContext, SeatHooks};
use crewlet::tasks::Tasks;
use crewlet::watchdog::Verdict;

const BIN: &str = env!("CARGO_BIN_EXE_crewlet");

#[test]
fn a_node_whose_sweep_loop_blocks_forever_exits_75() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("crewlet.toml");
    let mut f = std::fs::File::create(&config).unwrap();
    write!(
        f,
        "[node]\nlisten = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n\n[coordination]\nlease_ttl_seconds = 3\nheartbeat_seconds = 1\nsweep_seconds = 1\n\n[[roles]]\nhandle = \"w\"\n\n[logging]\nstderr = false\nfile = \"{}\"\n",
        dir.path().join("data").display(),
        dir.path().join("node.log").display()
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .args(["run", "--config"])
        .arg(&config)
        .env("CREWLET_FAULT_WEDGE_SWEEP", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The exit is the condition; the deadline is generous (TTL 3 s).
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the wedged node did not exit");
        }
        std::thread::park_timeout(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(75), "stderr: {stderr}");
    // The one line goes straight to stderr even though logging.stderr = false.
    assert!(
        stderr.contains("crewlet watchdog: the sweep loop has not turned"),
        "{stderr}"
    );
    assert!(stderr.contains("Exiting with code 75"), "{stderr}");
    let log = std::fs::read_to_string(dir.path().join("node.log")).unwrap_or_default();
    assert!(
        !log.contains("crewlet watchdog"),
        "the notice is not in logging.file"
    );
}

/// A node whose stderr is a pipe nobody drains — a supervisor that stopped
/// reading, a disk that stalls writers — keeps turning its loops: its log
/// lines wait on the log thread, not on the threads that renew its leases.
/// (Written from the runtime's workers, the node's log stalled every loop
/// at once once the pipe was full, and the watchdog ended it with 75.)
#[test]
fn a_node_whose_log_nobody_reads_keeps_turning_its_loops_past_the_ttl() {
    use std::os::fd::AsRawFd;
    let dir = tempfile::tempdir().unwrap();
    let port = support::free_port();
    let config = dir.path().join("crewlet.toml");
    std::fs::write(
        &config,
        format!(
            "[node]\nlisten = \"127.0.0.1:{port}\"\ndata_dir = \"{}\"\n\n[coordination]\nlease_ttl_seconds = 3\nheartbeat_seconds = 1\nsweep_seconds = 1\n\n[[roles]]\nhandle = \"w\"\n",
            dir.path().join("data").display(),
        ),
    )
    .unwrap();
    // Every line the node and its libraries have: the pipe fills in seconds.
    let mut child = Command::new(BIN)
        .args(["run", "--config"])
        .arg(&config)
        .env("RUST_LOG", "trace")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pipe = child.stderr.take().unwrap();
    let fd = pipe.as_raw_fd();
    // SAFETY: fcntl and ioctl on a pipe this process owns, reading an int.
    let capacity = unsafe { libc::fcntl(fd, libc::F_GETPIPE_SZ) };
    assert!(capacity > 0, "the pipe's capacity");
    let waiting = || {
        let mut n: libc::c_int = 0;
        // SAFETY: as above; FIONREAD writes one int.
        unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) };
        n
    };
    let alive = |child: &mut std::process::Child| {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the node ended ({status}) with its log unread")
        }
    };
    // Each request adds lines (a connection accepted, …). The pipe is full
    // when what waits in it stops growing though requests go on adding
    // lines (the kernel fills it page by page, so "full" is a little under
    // its capacity). Asked, a few times a second, until then and for three
    // TTLs more: the node answers every time and stays up — its loops
    // turned all along (a wedge ends it after one TTL).
    let deadline = Instant::now() + Duration::from_secs(60);
    while health_status(port).is_err() {
        alive(&mut child);
        assert!(Instant::now() < deadline, "the node never listened");
        std::thread::park_timeout(Duration::from_millis(50));
    }
    let (mut full_at, mut answers_since_full) = (None::<Instant>, 0);
    let (mut last_waiting, mut unchanged) = (0, 0);
    loop {
        alive(&mut child);
        let status = health_status(port).unwrap_or_else(|e| {
            panic!(
                "/health with {} of the log pipe's {capacity} bytes waiting: {e}",
                waiting()
            )
        });
        assert_eq!(status, "HTTP/1.1 200 OK", "/health");
        let now_waiting = waiting();
        unchanged = if now_waiting == last_waiting {
            unchanged + 1
        } else {
            0
        };
        last_waiting = now_waiting;
        match full_at {
            None if unchanged >= 5 && now_waiting >= capacity / 2 => full_at = Some(Instant::now()),
            None => assert!(
                Instant::now() < deadline,
                "the node's log never filled its pipe ({now_waiting} of {capacity} bytes)"
            ),
            Some(at) if at.elapsed() >= Duration::from_secs(9) => break,
            Some(_) => answers_since_full += 1,
        }
        // Paced: a few lines a request, some fifty requests a second — the log
        // thread's own buffer is never what fills.
        std::thread::park_timeout(Duration::from_millis(20));
    }
    assert!(
        answers_since_full > 1,
        "asked after the pipe filled: {answers_since_full}"
    );
    assert_eq!(waiting(), last_waiting, "nobody read the pipe meanwhile");
    let _ = child.kill();
    let _ = child.wait();
    drop(pipe);
}

/// The status line of `GET /health` on 127.0.0.1:`port`, read within 5 s.
fn health_status(port: u16) -> std::io::Result<String> {
    use std::io::{BufRead, BufReader};
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port))?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    conn.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
    let mut line = String::new();
    BufReader::new(conn).read_line(&mut line)?;
    Ok(line.trim_end().to_string())
}

/// Acquire hooks that take their time (a seat's memory to replay, say):
/// each hydration runs until the test opens the gate.
struct GatedHooks(tokio::sync::watch::Receiver<bool>);

impl GatedHooks {
    /// The hooks, and the gate's sender (`send(true)` opens it).
    fn new() -> (Arc<Self>, tokio::sync::watch::Sender<bool>) {
        let (open, gate) = tokio::sync::watch::channel(false);
        (Arc::new(Self(gate)), open)
    }
}

#[async_trait::async_trait]
impl SeatHooks for GatedHooks {
    async fn hydrate_memory(&self, _s: &SeatContext) -> Result<(), HookError> {
        let mut gate = self.0.clone();
        let _ = gate.wait_for(|open| *open).await;
        Ok(())
    }
    fn inbox_handler(&self, _s: &SeatContext, _f: Fence) -> Arc<dyn Handler> {
        handler_fn(|_d: Delivery| async { Disposition::Ack })
    }
}

/// A node's seat engine on the twin, `seats` seats, TTL 3 s, every seat
/// claimable in one pass; started (its loops run, the watchdog thread is
/// not armed: the test reads its verdict).
async fn engine_on_twin(seats: usize, hooks: Arc<dyn SeatHooks>) -> (Arc<SeatEngine>, Tasks) {
    let store: Arc<dyn Store> = Arc::new(Coordinator::new(
        TwinBackend::new(Duration::from_secs(3)),
        CoordinatorOptions::default(),
    ));
    engine_on(store, "n", seats, hooks).await
}

/// [`engine_on_twin`] on a given store, as node `node_id` (two engines on
/// one store are a fleet of two).
async fn engine_on(
    store: Arc<dyn Store>,
    node_id: &str,
    seats: usize,
    hooks: Arc<dyn SeatHooks>,
) -> (Arc<SeatEngine>, Tasks) {
    let queue: Arc<dyn Queue> = Arc::new(TwinQueue::new(log_events()));
    let roles: Vec<RoleConfig> = (0..seats)
        .map(|i| RoleConfig {
            handle: format!("s{i}"),
            agent: Default::default(),
            placement: PlacementConfig::default(),
            mcp: Vec::new(),
            ..Default::default()
        })
        .collect();
    company::apply(&*store, "Watchdog company", &roles)
        .await
        .unwrap();
    let first = company::active(&*store).await.unwrap().unwrap();
    let tasks = Tasks::new();
    let company_rx = company::follow(store.clone(), first, &tasks);
    let owner = crewlet::node::Incarnation::mint(node_id).to_string();
    let engine = SeatEngine::new(
        EngineConfig {
            node_id: node_id.into(),
            owner: owner.clone(),
            labels: vec![],
            protocol: 4,
            heartbeat: Duration::from_secs(1),
            sweep: Duration::from_secs(1),
            claim_limit: seats,
            release_limit: 2,
            release_wait: Duration::from_secs(1),
            queue: QueueSettings::default(),
            handoff: Default::default(),
        },
        store,
        queue,
        hooks,
        EventBus::new(node_id, &owner),
        company_rx,
        tasks.clone(),
    )
    .await
    .unwrap();
    engine.start();
    (engine, tasks)
}

/// Watch the engine's watchdog verdict until `done` holds (at most 30 s):
/// never wedged.
async fn never_wedged_until(engine: &SeatEngine, what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        let verdict = engine.watchdog().current();
        assert!(
            !matches!(verdict, Verdict::Wedged { .. }),
            "{verdict:?} before {what}"
        );
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One sweep pass whose claims' acquire hooks run past the TTL (three
/// seconds) is turning, and the watchdog must say so (in the chaos harness
/// it took such a pass for a wedged loop and the node exited 75 in the
/// middle of a rolling restart). The hooks are held until the pass has run
/// past the TTL with the watchdog read all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_pass_that_claims_seat_after_seat_is_not_a_wedged_loop() {
    let (hooks, open) = GatedHooks::new();
    let (engine, tasks) = engine_on_twin(10, hooks).await;
    let claiming = || !engine.host().held().is_empty();
    never_wedged_until(&engine, "the pass to claim", claiming).await;
    let since = Instant::now();
    never_wedged_until(&engine, "the pass's claims to run past the TTL", || {
        since.elapsed() > Duration::from_secs(3)
    })
    .await;
    open.send(true).expect("the hooks hold the gate");
    let attached = || {
        engine
            .host()
            .status()
            .iter()
            .filter(|s| s.phase == Phase::Attached)
            .count()
    };
    never_wedged_until(&engine, "ten seats attached", || attached() == 10).await;
    engine.crash().await;
    tasks.shutdown().await;
}

/// An acquire hook that fails after a while, and a teardown that takes a
/// while too: what a queue that stopped answering does to a claim.
#[derive(Default)]
struct FailingHooks {
    given_back: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl SeatHooks for FailingHooks {
    async fn attach_control(
        &self,
        _s: &SeatContext,
    ) -> Result<Option<crewlet::queue::Attachment>, HookError> {
        tokio::time::sleep(Duration::from_secs(2)).await;
        Err(HookError::new(
            "control attach",
            "the queue did not answer within 2s",
        ))
    }
    fn inbox_handler(&self, _s: &SeatContext, _f: Fence) -> Arc<dyn Handler> {
        handler_fn(|_d: Delivery| async { Disposition::Ack })
    }
    async fn release(&self, _s: &SeatContext) -> Result<(), HookError> {
        tokio::time::sleep(Duration::from_secs(2)).await;
        self.given_back
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }
}

/// Found by the chaos harness: during a NATS leader election a claim's
/// control attach timed out (2 s) and the seat was handed back, its
/// teardown waiting on the store too — one claim, two bounded steps, more
/// than the TTL of 3 s — and the sweep loop was shot as wedged (exit 75).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_hook_fails_and_hands_the_seat_back_is_not_a_wedged_loop() {
    let hooks = Arc::new(FailingHooks::default());
    let (engine, tasks) = engine_on_twin(1, hooks.clone()).await;
    never_wedged_until(&engine, "two claims handed back", || {
        hooks.given_back.load(std::sync::atomic::Ordering::SeqCst) >= 2
    })
    .await;
    engine.crash().await;
    tasks.shutdown().await;
}

/// The node-order reads a pass makes while its config bucket does not
/// answer: each waits out the store's bound (2 s) and fails.
#[derive(Default)]
struct SilentConfig {
    silent: std::sync::atomic::AtomicBool,
    /// Reads of when the nodes were first seen, each left unanswered.
    seen_reads: std::sync::atomic::AtomicUsize,
}

const STORE_BOUND: Duration = Duration::from_secs(2);

#[async_trait::async_trait]
impl Faults for SilentConfig {
    async fn before(&self, call: Call<'_>) -> Result<(), StoreError> {
        use std::sync::atomic::Ordering::SeqCst;
        let config = matches!(
            call,
            Call::Get(StateBucket::Config, _) | Call::Entries(StateBucket::Config, _)
        );
        if !(config && self.silent.load(SeqCst)) {
            return Ok(());
        }
        if call == Call::Entries(StateBucket::Config, crewlet::seat::ranking::SEEN_PREFIX) {
            self.seen_reads.fetch_add(1, SeqCst);
        }
        tokio::time::sleep(STORE_BOUND).await;
        Err(StoreError::Timeout(STORE_BOUND))
    }
}

/// Soak seed 12062 (nats-server 2.9.10): a node restarted during a NATS
/// follower restart exited 75 — its sweep met a node it had not seen, read
/// when the nodes were first seen and then the node order, each call
/// waiting out its 2 s bound with no beat between them (3.7 s against a
/// TTL of 3 s). A pass reading a store that does not answer is waiting on
/// bounded calls, not wedged: here every pass that meets the new node
/// makes both reads, and the passes must go on, unshot, until two of them
/// have waited through both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_reading_the_node_order_from_a_silent_store_is_not_a_wedged_loop() {
    use std::sync::atomic::Ordering::SeqCst;
    let twin: Arc<dyn Store> = Arc::new(Coordinator::new(
        TwinBackend::new(Duration::from_secs(3)),
        CoordinatorOptions::default(),
    ));
    let store = Faulty::wrap(twin, SilentConfig::default());
    let (engine, tasks) = engine_on(store.clone(), "n", 2, Arc::new(FastHooks)).await;
    never_wedged_until(&engine, "both seats held", || {
        engine.host().held().len() == 2
    })
    .await;
    store.silent.store(true, SeqCst);
    // A live peer the node has not seen, renewed as a live node would.
    let req = ClaimRequest::new("node:peer", "peer:00000001", "peer").with_protocol(4);
    let Ok(Claim::Won(mut peer)) = store.claim(req).await else {
        panic!("the peer's presence could not be claimed");
    };
    let stop = tokio_util::sync::CancellationToken::new();
    let renewing = {
        let (store, stop) = (store.clone(), stop.clone());
        tokio::spawn(async move {
            let mut beat = tokio::time::interval(Duration::from_millis(500));
            while stop.run_until_cancelled(beat.tick()).await.is_some() {
                if let Renewal::Renewed(l) = store.renew(&peer, "peer:00000001", None).await {
                    peer = l;
                }
            }
        })
    };
    // A second pass reads when the nodes were first seen once the first
    // has waited through that read and the order's.
    never_wedged_until(&engine, "two passes through the silent reads", || {
        store.seen_reads.load(SeqCst) >= 2
    })
    .await;
    stop.cancel();
    renewing.await.expect("the peer's renewals end");
    engine.crash().await;
    tasks.shutdown().await;
}

/// One node on a real nats-server holding ten seats, TTL 10 s, every store
/// call bounded at 3 s (in the chaos harness a restart of the leases' NATS
/// leader took every node of the fleet down with exit 75 this way). The
/// server is stopped for longer than the TTL; the heartbeat's renewals all
/// end at the store timeout and its loop must go on turning in the
/// watchdog's eyes (renewed one seat after the other, the pass outlasted
/// the TTL). The seats are fenced (grace expired) all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_against_a_silent_store_is_not_a_wedged_loop() {
    silent_store(Duration::from_secs(10), Duration::from_secs(3), 14, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_whose_presence_write_waits_behind_the_heartbeats_is_not_a_wedged_loop() {
    // The chaos soak's timings (TTL 3 s, store calls bounded at 2 s): the
    // seats are fenced, their releases and the presence writes each wait
    // out the store's bound, and the sweep's presence write waits behind
    // the heartbeat's on the presence lock. Waiting on bounded calls is
    // not being wedged.
    silent_store(Duration::from_secs(3), Duration::from_secs(2), 10, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_handing_seats_over_when_the_store_falls_silent_is_not_a_wedged_loop() {
    // Seen in the chaos soak (seed 1018): seats offered to a peer, the
    // store's NATS leader restarted, the heartbeat fenced the offered
    // seats, and the sweep — clearing the offer's notice and reading the
    // lease once more, each call waiting out its 2 s bound — went 3.2 s
    // without a beat and was shot. A peer that never takes makes the
    // offers stand until the store falls silent.
    silent_store(Duration::from_secs(3), Duration::from_secs(2), 10, true).await;
}

async fn silent_store(ttl: Duration, timeout: Duration, silent_secs: u64, ghost_peer: bool) {
    use crewlet::coord::{NatsBackend, NatsOptions};
    use crewlet::queue::jetstream::{JetStreamQueue, JetStreamSettings};
    let server = support::nats::NatsServer::start().await;
    let mut opts = NatsOptions::new(vec![server.url()]);
    opts.lease_ttl = ttl;
    opts.store_timeout = timeout;
    let backend = NatsBackend::connect(&opts).await.unwrap();
    let client = backend.client().clone();
    let store: Arc<dyn Store> = Arc::new(Coordinator::new(
        backend,
        CoordinatorOptions {
            store_timeout: timeout,
            ..CoordinatorOptions::default()
        },
    ));
    let ghost_store = store.clone();
    let queue: Arc<dyn Queue> = Arc::new(
        JetStreamQueue::new(
            client,
            JetStreamSettings {
                replicas: 1,
                timeout,
            },
            log_events(),
        )
        .await
        .unwrap(),
    );
    let roles: Vec<RoleConfig> = (0..10)
        .map(|i| RoleConfig {
            handle: format!("s{i}"),
            agent: Default::default(),
            placement: PlacementConfig::default(),
            mcp: Vec::new(),
            ..Default::default()
        })
        .collect();
    company::apply(&*store, "Watchdog company", &roles)
        .await
        .unwrap();
    let first = company::active(&*store).await.unwrap().unwrap();
    let tasks = Tasks::new();
    let company_rx = company::follow(store.clone(), first, &tasks);
    let owner = crewlet::node::Incarnation::mint("n").to_string();
    let engine = SeatEngine::new(
        EngineConfig {
            node_id: "n".into(),
            owner: owner.clone(),
            labels: vec![],
            protocol: 4,
            heartbeat: Duration::from_secs(1),
            sweep: Duration::from_secs(1),
            claim_limit: 10,
            release_limit: 2,
            release_wait: Duration::from_secs(1),
            queue: QueueSettings::default(),
            handoff: Default::default(),
        },
        store,
        queue,
        Arc::new(FastHooks),
        EventBus::new("n", &owner),
        company_rx,
        tasks.clone(),
    )
    .await
    .unwrap();
    engine.start();
    support::wait_for(
        "the ten seats to be attached",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || async { (engine.host().held().len() == 10).then_some(()) },
    )
    .await;
    let ghost = tokio_util::sync::CancellationToken::new();
    if ghost_peer {
        // A live, serving peer holding nothing: placement gives it half the
        // seats, offered one after the other; it never takes them.
        let mut offered = engine.events().subscribe();
        let (store, stop) = (ghost_store.clone(), ghost.clone());
        tokio::spawn(async move {
            let req = ClaimRequest::new("node:ghost", "ghost:00000001", "ghost")
                .with_protocol(4)
                .with_metadata(crewlet::coord::Metadata::from_iter([(
                    "seats_held".to_string(),
                    serde_json::json!(0),
                )]));
            let Ok(Claim::Won(mut lease)) = store.claim(req).await else {
                return;
            };
            // Renewed at a heartbeat's cadence, as a live node would.
            let mut beat = tokio::time::interval(Duration::from_millis(500));
            beat.tick().await;
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = beat.tick() => {}
                }
                if let Renewal::Renewed(l) = store.renew(&lease, "ghost:00000001", None).await {
                    lease = l;
                }
            }
        });
        support::wait_for(
            "a seat offered to the peer",
            Duration::from_secs(30),
            Duration::from_millis(1),
            || {
                let mut got = false;
                while let Ok(e) = offered.try_recv() {
                    got |= matches!(e.event, crewlet::events::Event::SeatOffered { .. });
                }
                async move { got.then_some(()) }
            },
        )
        .await;
    }
    let pid = server.pid().unwrap() as i32;
    // SAFETY: kill(2) on the nats-server this test started.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    ghost.cancel();
    let silent_until = Instant::now() + Duration::from_secs(silent_secs);
    let mut wedged = None;
    while Instant::now() < silent_until {
        if let Verdict::Wedged { loop_name, lag } = engine.watchdog().current() {
            wedged.get_or_insert((loop_name, lag));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    unsafe { libc::kill(pid, libc::SIGCONT) };
    assert_eq!(wedged, None, "a loop the watchdog would have shot");
    assert!(
        engine.host().held().is_empty(),
        "every seat was fenced a TTL after its last renewal: {:?}",
        engine.host().held()
    );
    engine.crash().await;
    tasks.shutdown().await;
}

/// Acquire hooks that do nothing.
struct FastHooks;

#[async_trait::async_trait]
impl SeatHooks for FastHooks {
    fn inbox_handler(&self, _s: &SeatContext, _f: Fence) -> Arc<dyn Handler> {
        handler_fn(|_d: Delivery| async { Disposition::Ack })
    }
}

/// Hooks whose inbox turn runs until the test lets it end, recording when
/// it began and when it ended.
#[derive(Default)]
struct LongTurnHooks {
    started: Arc<std::sync::Mutex<Option<Instant>>>,
    release: Arc<tokio::sync::Notify>,
    done: Arc<std::sync::atomic::AtomicBool>,
}

#[async_trait::async_trait]
impl SeatHooks for LongTurnHooks {
    fn inbox_handler(&self, _s: &SeatContext, _f: Fence) -> Arc<dyn Handler> {
        let (started, release, done) = (
            self.started.clone(),
            self.release.clone(),
            self.done.clone(),
        );
        handler_fn(move |_d: Delivery| {
            let (started, release, done) = (started.clone(), release.clone(), done.clone());
            async move {
                *started.lock().unwrap() = Some(Instant::now());
                release.notified().await;
                done.store(true, std::sync::atomic::Ordering::SeqCst);
                Disposition::Ack
            }
        })
    }
}

/// The seats' turn dispatch is watched (spec § The wedged node: every
/// duty stamps a beat): the watchdog follows each attached inbox's loop as
/// `dispatch:{seat}`, a turn longer than the TTL is that loop turning, not
/// a wedge, and a seat let go takes its loop out of the watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_seats_turn_dispatch_is_watched_a_long_turn_is_not_a_wedge_and_a_released_seat_stands_down()
 {
    let hooks = Arc::new(LongTurnHooks::default());
    let (engine, tasks) = engine_on_twin(1, hooks.clone()).await;
    let watched = |e: &SeatEngine| {
        e.watchdog()
            .beats()
            .get("dispatch:s0")
            .is_some_and(|b| b.live)
    };
    never_wedged_until(&engine, "s0's dispatch to be watched", || watched(&engine)).await;
    engine
        .queue()
        .publish(
            "crewlet.agent.s0.inbox",
            None,
            bytes::Bytes::from_static(b"a long turn"),
        )
        .await
        .unwrap();
    // The turn runs past the TTL (3 s) and a second more: the dispatch
    // loop is turning all the while.
    never_wedged_until(&engine, "the turn to have run longer than the TTL", || {
        hooks
            .started
            .lock()
            .unwrap()
            .is_some_and(|t| t.elapsed() > Duration::from_secs(4))
    })
    .await;
    hooks.release.notify_one();
    never_wedged_until(&engine, "the long turn to end", || {
        hooks.done.load(std::sync::atomic::Ordering::SeqCst)
    })
    .await;
    engine.drain().await;
    assert!(
        !engine.watchdog().beats().contains_key("dispatch:s0"),
        "a released seat's dispatch is no longer watched: {:?}",
        engine.watchdog().beats().keys().collect::<Vec<_>>()
    );
    drop(tasks);
}

/// A take of an offered seat is watched while it runs (ARCHITECTURE.md:
/// every loop that can hold a seat's lock or lease is): the taker's
/// watchdog follows it as `take-offer:{seat}`, a take whose hydration runs
/// past the TTL (held until the take has been watched for longer than the
/// TTL, three seconds) is turning, not wedged, and a finished take stands
/// down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_of_an_offered_seat_is_watched_until_it_ends_and_a_slow_one_is_not_a_wedge() {
    let store: Arc<dyn Store> = Arc::new(Coordinator::new(
        TwinBackend::new(Duration::from_secs(3)),
        CoordinatorOptions::default(),
    ));
    let (giver, giver_tasks) = engine_on(store.clone(), "a", 1, Arc::new(FastHooks)).await;
    never_wedged_until(&giver, "a to hold s0", || giver.host().held().len() == 1).await;
    let (hooks, open) = GatedHooks::new();
    let (taker, taker_tasks) = engine_on(store, "b", 1, hooks).await;
    let host = giver.host().clone();
    let handing = tokio::spawn(async move {
        host.hand_off(
            "s0",
            "b",
            crewlet::events::DetachReason::Moved,
            Duration::from_secs(20),
            &|| {},
        )
        .await
    });
    let taking = |e: &SeatEngine| {
        e.watchdog()
            .beats()
            .get("take-offer:s0")
            .is_some_and(|b| b.live)
    };
    never_wedged_until(&taker, "b's take of s0 to be watched", || taking(&taker)).await;
    let since = Instant::now();
    never_wedged_until(&taker, "b's take to run past the TTL", || {
        since.elapsed() > Duration::from_secs(3)
    })
    .await;
    open.send(true).expect("the hooks hold the gate");
    never_wedged_until(
        &taker,
        "b to hold s0 after a hydration past the TTL",
        || taker.host().held().len() == 1,
    )
    .await;
    let handed = handing.await.expect("the hand-off task");
    assert!(
        matches!(handed, crewlet::seat::host::HandOff::Taken { .. }),
        "{handed:?}"
    );
    never_wedged_until(&taker, "the finished take to stand down", || {
        !taking(&taker)
    })
    .await;
    giver.crash().await;
    taker.crash().await;
    giver_tasks.shutdown().await;
    taker_tasks.shutdown().await;
}

/// A duty whose tick never returns.
struct StuckDuty;

#[async_trait::async_trait]
impl crewlet::duty::Duty for StuckDuty {
    fn name(&self) -> &'static str {
        "stuck"
    }
    fn every(&self) -> Duration {
        Duration::from_millis(100)
    }
    async fn tick(&self) {
        std::future::pending::<()>().await;
    }
}

/// A duty ticking once an hour whose tick takes three steps and then
/// blocks on something that never returns.
struct StepsThenStuck;

#[async_trait::async_trait]
impl crewlet::duty::Duty for StepsThenStuck {
    fn name(&self) -> &'static str {
        "steps_then_stuck"
    }
    fn every(&self) -> Duration {
        Duration::from_secs(3600)
    }
    async fn tick(&self) {
        for _ in 0..3 {
            crewlet::duty::turned();
            tokio::task::yield_now().await;
        }
        std::future::pending::<()>().await;
    }
}

/// A duty ticking once an hour whose one tick takes a step each time the
/// test says so (`steps`), until it is told to end.
struct LongTurning {
    steps: Arc<tokio::sync::Notify>,
    end: Arc<std::sync::atomic::AtomicBool>,
    ended: Arc<std::sync::atomic::AtomicBool>,
}

#[async_trait::async_trait]
impl crewlet::duty::Duty for LongTurning {
    fn name(&self) -> &'static str {
        "long_turning"
    }
    fn every(&self) -> Duration {
        Duration::from_secs(3600)
    }
    async fn tick(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        while !self.end.load(SeqCst) {
            crewlet::duty::turned();
            self.steps.notified().await;
        }
        self.ended.store(true, SeqCst);
    }
}

/// The loop `dog` names wedged, waited for (30 s at most).
async fn wedged_loop(dog: &crewlet::watchdog::Watchdog, what: &str) -> String {
    support::wait_for(
        what,
        Duration::from_secs(30),
        Duration::from_millis(50),
        || {
            let v = dog.current();
            async move {
                match v {
                    Verdict::Wedged { loop_name, .. } => Some(loop_name),
                    _ => None,
                }
            }
        },
    )
    .await
}

fn duty_context(dog: &crewlet::watchdog::Watchdog) -> crewlet::duty::DutyContext {
    crewlet::duty::DutyContext {
        store: Arc::new(Coordinator::new(
            TwinBackend::new(Duration::from_secs(3)),
            CoordinatorOptions::default(),
        )),
        node_id: "n".into(),
        owner: "n:1".into(),
        protocol: 4,
        events: EventBus::new("n", "n:1"),
        watchdog: Some(dog.clone()),
    }
}

/// Spec § The wedged node: each duty stamps a beat as it turns. A tick
/// that stops turning is named wedged within a step bound of its last step
/// (four thresholds) — not three of its duty's ticks, which for a duty
/// ticking hourly would be three hours — while a tick that goes on turning
/// is never named, however long it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duty_tick_that_stops_turning_is_wedged_within_a_step_bound_not_three_of_its_ticks() {
    use crewlet::duty::Duties;
    use std::sync::atomic::Ordering::SeqCst;
    let threshold = Duration::from_secs(1);
    assert_eq!(crewlet::duty::step_bound(threshold), Duration::from_secs(4));
    let tasks = Tasks::new();

    // Turning for longer than a step bound (and the threshold): not wedged.
    let dog = crewlet::watchdog::Watchdog::new(threshold);
    let (end, ended) = (
        Arc::new(std::sync::atomic::AtomicBool::new(false)),
        Arc::new(std::sync::atomic::AtomicBool::new(false)),
    );
    let steps = Arc::new(tokio::sync::Notify::new());
    let long = Duties::new();
    let began = std::time::Instant::now();
    long.start(
        &tasks,
        duty_context(&dog),
        Arc::new(LongTurning {
            steps: steps.clone(),
            end: end.clone(),
            ended: ended.clone(),
        }),
    );
    support::wait_for(
        "the long tick to have turned past a step bound",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || {
            let v = dog.current();
            assert!(
                !matches!(v, Verdict::Wedged { .. }),
                "a turning tick was named wedged: {v:?}"
            );
            // One step of the tick per look (every 50 ms): it turns
            // steadily while the test watches.
            steps.notify_one();
            let past = began.elapsed() > Duration::from_secs(6);
            async move { past.then_some(()) }
        },
    )
    .await;
    end.store(true, SeqCst);
    steps.notify_one();
    support::wait_for(
        "the long tick to end",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || {
            let done = ended.load(SeqCst);
            async move { done.then_some(()) }
        },
    )
    .await;
    long.stop();

    // Three steps, then blocked: named within a step bound and the
    // threshold of its last step.
    let dog = crewlet::watchdog::Watchdog::new(threshold);
    let stuck = Duties::new();
    stuck.start(&tasks, duty_context(&dog), Arc::new(StepsThenStuck));
    let named = wedged_loop(&dog, "the blocked tick to read as wedged").await;
    assert_eq!(named, "duty:steps_then_stuck");
    stuck.abandon();
}

/// A duty that ticks and returns.
struct TickingDuty;

#[async_trait::async_trait]
impl crewlet::duty::Duty for TickingDuty {
    fn name(&self) -> &'static str {
        "ticking"
    }
    fn every(&self) -> Duration {
        Duration::from_millis(100)
    }
    async fn tick(&self) {}
}

/// The duty loops are watched as `duty:{name}`: one whose tick blocks on
/// something that never returns stops beating once its lease (three ticks)
/// has lapsed under it and is named wedged; one that was stopped is no
/// longer watched (a duty that is gone is not a duty that is wedged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duty_blocked_in_its_tick_is_a_wedged_loop_and_a_stopped_duty_stands_down() {
    use crewlet::duty::Duties;
    let dog = crewlet::watchdog::Watchdog::new(Duration::from_secs(1));
    let tasks = Tasks::new();
    let ctx = duty_context(&dog);
    let ticking = Duties::new();
    ticking.start(&tasks, ctx.clone(), Arc::new(TickingDuty));
    let stuck = Duties::new();
    stuck.start(&tasks, ctx, Arc::new(StuckDuty));
    let named = wedged_loop(&dog, "the stuck duty to read as wedged").await;
    assert_eq!(named, "duty:stuck");
    assert!(
        dog.beats()["duty:ticking"].live,
        "the ticking duty is watched"
    );
    ticking.stop();
    support::wait_for(
        "the stopped duty to leave the watch",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || {
            let gone = dog.beats().get("duty:ticking").is_some_and(|b| !b.live);
            async move { gone.then_some(()) }
        },
    )
    .await;
    stuck.abandon();
}
