//! Dashboard benchmarks: prints a table, asserts nothing.
//! `cargo bench -p server --bench dashboard` (docs/testing.md § Benchmarks).
//!
//! Rows:
//! - a seat's page with 10,000 events about it kept, first render (its
//!   timeline's first row);
//! - Settings › Nodes and Seats, first render in headless Chromium with
//!   100 nodes and 10,000 seats (a node in this process whose coordination
//!   store is seeded with 100 presence rows and 10,000 seat leases) — from
//!   navigation start to the rows in the DOM, and to hydrated; goal ≤ 1 s;
//! - event → DOM: the node emits an event (a pause of a seat, stamped with
//!   the wall clock just before it is emitted) and the browser notes when
//!   the Events page and the Seats page first show it (a MutationObserver),
//!   p50 / p99 over lone events 250 ms apart on loopback; goal p99 ≤ 100 ms;
//! - the pages' reads (`fleet`, `list_seats`) over HTTP at that size;
//! - node CPU with no viewer and 1,000 idle seats (the `crewlet` binary of
//!   this build, its `/proc/{pid}/stat` over 30 s); goal ≤ 1 % of a core;
//!   then the same with the memory changelog cycle off, for comparison;
//! - the node's resident memory (`VmRSS`) per held seat: the 1,000-seat
//!   node against the same node holding 10.
//!
//! The browser rows need the dashboard's browser half (`./dev build`, or
//! `CREWLET_SITE_ROOT`), end2end's packages (`npm ci` in end2end/) and
//! Debian's chromium; without them those rows say why they were skipped.
//! `CREWLET_BENCH_EVENTS` (default 300) and `CREWLET_BENCH_CPU_SECONDS`
//! (default 30) change the sample sizes.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crewlet::config::Config;
use crewlet::coord::{Claim, ClaimRequest, Metadata};
use crewlet::engine::pause::{self, PauseRecord};
use crewlet::events::Event;
use crewlet::node::{self, RunningNode};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const NODES: usize = 100;
const SEATS: usize = 10_000;
const IDLE_SEATS: usize = 1_000;
/// The idle node the resident memory per seat is measured against.
const FEW_SEATS: usize = 10;
/// Between two measured events: longer than a page's refetch window
/// (`app::live::COALESCE_MS`), so each event is a lone one.
const EVENT_SPACING: Duration = Duration::from_millis(250);
const NAME: &str = "bench";
const PASSWORD: &str = "bench-password-1";
/// A viewer token, for reading the kept events while seeding them.
const TOKEN: &str = "bench-viewer-token-1";
/// The seat whose page is measured, and how many events about it are kept.
const STORY_SEAT: &str = "seat-00001";
const STORY_EVENTS: usize = 10_000;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

fn now_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1000.0)
        .unwrap_or_default()
}

fn env_number(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The site the in-process node serves: `CREWLET_SITE_ROOT`, else the
/// release build's, else the debug build's.
fn site_root() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("CREWLET_SITE_ROOT") {
        return Some(PathBuf::from(p));
    }
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| workspace().join("target"));
    ["release", "debug"]
        .into_iter()
        .map(|mode| target.join(mode).join("site"))
        .find(|s| s.join("pkg").join("crewlet.js").is_file())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[(((sorted.len() - 1) as f64) * p).round() as usize]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    percentile(&v, 0.5)
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NAN, f64::max)
}

/// A node whose company has `SEATS` seats placed on the label `seeded`,
/// which it does not carry: only the seeded nodes may hold them.
async fn seeded_node(dir: &Path) -> RunningNode {
    let roles: String = (0..SEATS)
        .map(|i| {
            format!(
                "[[roles]]\nhandle = \"seat-{i:05}\"\nplacement = {{ labels = [\"seeded\"] }}\n"
            )
        })
        .collect();
    let text = format!(
        "[node]\nid = \"bench-dashboard\"\nlisten = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n\n\
         [company]\nname = \"Bench company\"\n\n\
         [coordination]\nlease_ttl_seconds = 3600\n\n\
         {roles}\n\
         [[auth.users]]\nname = \"{NAME}\"\npassword_hash = \"{}\"\nrole = \"operator\"\n\n\
         [[auth.tokens]]\nname = \"bench\"\nsha256 = \"{}\"\nrole = \"viewer\"\n",
        dir.join("data").display(),
        crewlet::web::auth::hash_password(PASSWORD).expect("hash"),
        {
            use sha2::Digest;
            hex::encode(sha2::Sha256::digest(TOKEN.as_bytes()))
        },
    );
    let config = Config::parse("bench.toml", &text, &BTreeMap::new()).expect("config");
    let node = node::start(config).await.expect("the node starts");
    let store = node.engine.store().clone();
    // 100 live nodes carrying the label, each holding 100 seats.
    for n in 0..NODES {
        let id = format!("bench-{n:03}");
        let mut meta = Metadata::new();
        meta.insert("labels".into(), json!(["seeded"]));
        meta.insert("roles".into(), json!([]));
        meta.insert("version".into(), json!(crewlet::VERSION));
        meta.insert("seats_held".into(), json!(SEATS / NODES));
        meta.insert("seats_withdrawn".into(), json!(false));
        meta.insert("draining".into(), json!(false));
        meta.insert("behind".into(), json!(false));
        let req = ClaimRequest::new(format!("node:{id}"), format!("{id}:seeded"), id.clone())
            .with_metadata(meta);
        assert!(matches!(store.claim(req).await, Ok(Claim::Won(_))));
    }
    for s in 0..SEATS {
        let id = format!("bench-{:03}", s % NODES);
        let req = ClaimRequest::new(format!("seat:seat-{s:05}"), format!("{id}:seeded"), id);
        assert!(matches!(store.claim(req).await, Ok(Claim::Won(_))));
    }
    node
}

/// `GET path` on the node with the viewer token, as JSON.
async fn viewer_get(node: &RunningNode, path: &str) -> Result<Value, String> {
    reqwest::Client::new()
        .get(format!("http://{}{path}", node.addr))
        .bearer_auth(TOKEN)
        .send()
        .await
        .map_err(|e| e.to_string())?
        .json()
        .await
        .map_err(|e| e.to_string())
}

/// Keep [`STORY_EVENTS`] events about [`STORY_SEAT`] (pauses, each its own
/// reason), emitted in batches the node's history writer keeps up with;
/// answers how many it kept (read back page by page).
async fn seed_story(node: &RunningNode) -> Result<usize, String> {
    const BATCH: usize = 250;
    let events = node.engine.events();
    let newest = format!("/api/events/history?seat={STORY_SEAT}&limit=1");
    for start in (0..STORY_EVENTS).step_by(BATCH) {
        let end = (start + BATCH).min(STORY_EVENTS);
        for i in start..end {
            events.emit(Event::SeatPaused {
                seat: STORY_SEAT.into(),
                by: NAME.into(),
                reason: Some(format!("story-{i}")),
                stop_running_turn: false,
            });
        }
        // Until the batch's last one is kept.
        let last = format!("story-{}", end - 1);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let page = viewer_get(node, &newest).await?;
            let kept = page["events"][0]["data"]
                .as_str()
                .and_then(|d| serde_json::from_str::<Value>(d).ok())
                .and_then(|d| d["reason"].as_str().map(str::to_string));
            if kept.as_deref() == Some(last.as_str()) {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("the node did not keep {last} within 30 s"));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let mut kept = 0;
    let mut before = String::new();
    loop {
        let page = viewer_get(
            node,
            &format!("/api/events/history?seat={STORY_SEAT}&limit=500{before}"),
        )
        .await?;
        let list = page["events"].as_array().cloned().unwrap_or_default();
        kept += list.len();
        match (
            page["more"].as_bool(),
            list.last().and_then(|e| e["id"].as_u64()),
        ) {
            (Some(true), Some(id)) => before = format!("&before={id}"),
            _ => break,
        }
    }
    Ok(kept)
}

/// The next line the browser script printed, as JSON.
async fn next_json(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
) -> Result<Value, String> {
    let line = lines
        .next_line()
        .await
        .map_err(|e| e.to_string())?
        .ok_or("the browser script stopped early")?;
    serde_json::from_str(&line).map_err(|e| format!("{e}: {line}"))
}

/// What the browser measured.
struct BrowserRows {
    nodes: Vec<Value>,
    seats: Vec<Value>,
    /// A seat's page with [`STORY_EVENTS`] events about it, and how many
    /// the node kept.
    seat_page: Vec<Value>,
    story_kept: usize,
    events_ms: Vec<f64>,
    seats_ms: Vec<f64>,
}

async fn browser_rows(node: &RunningNode) -> Result<BrowserRows, String> {
    let script = workspace().join("end2end/bench/dashboard.mjs");
    if !workspace()
        .join("end2end/node_modules/playwright-core")
        .is_dir()
    {
        return Err("end2end's packages are not installed (npm ci in end2end/)".into());
    }
    eprintln!("keeping {STORY_EVENTS} events about {STORY_SEAT}…");
    let story_kept = seed_story(node).await?;
    let mut child = tokio::process::Command::new("node")
        .arg(&script)
        .env("BENCH_STORY_SEAT", STORY_SEAT)
        .env("BENCH_URL", format!("http://{}", node.addr))
        .env("BENCH_NAME", NAME)
        .env("BENCH_PASSWORD", PASSWORD)
        .env("BENCH_SEAT", "seat-00000")
        .env("BENCH_NODE", format!("bench-{:03}", NODES - 1))
        .env("BENCH_SEAT_ON_PAGE", "seat-00049")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run node: {e}"))?;
    let mut stdin = child.stdin.take().expect("stdin");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();

    eprintln!("measuring the first render of Nodes and Seats…");
    let render = next_json(&mut lines).await?;
    let nodes = render["render"]["nodes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let seats = render["render"]["seats"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let seat_page = render["render"]["seat_page"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let ready = next_json(&mut lines).await?;
    if ready["ready"] != true {
        return Err(format!("unexpected: {ready}"));
    }

    let engine = node.engine.clone();
    let n = env_number("CREWLET_BENCH_EVENTS", 300);
    eprintln!("measuring event → DOM over {n} events…");
    let (mut events_ms, mut seats_ms) = (Vec::new(), Vec::new());
    for i in 0..n {
        let reason = format!("bench-{i}!");
        let record = PauseRecord {
            by: NAME.into(),
            at: crewlet::clock::now_rfc3339(),
            reason: Some(reason.clone()),
            stop_running_turn: false,
        };
        pause::pause(&**engine.store(), &**engine.queue(), "seat-00000", record)
            .await
            .map_err(|e| e.to_string())?;

        let emitted = now_ms();
        engine.events().emit(Event::SeatPaused {
            seat: "seat-00000".into(),
            by: NAME.into(),
            reason: Some(reason),
            stop_running_turn: false,
        });
        stdin
            .write_all(format!("seen? {i}\n").as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let seen = next_json(&mut lines).await?;
        let at = |k: &str| seen[k].as_f64().unwrap_or(f64::NAN) - emitted;
        events_ms.push(at("events"));
        seats_ms.push(at("seats"));
        // Lone events: the next one after the pages' refetch window.
        tokio::time::sleep(EVENT_SPACING).await;
    }
    let _ = stdin.write_all(b"done\n").await;
    drop(stdin);
    let _ = child.wait().await;
    Ok(BrowserRows {
        nodes,
        seats,
        seat_page,
        story_kept,
        events_ms,
        seats_ms,
    })
}

/// How long the pages' server functions take at this size, asked over
/// HTTP with a session: (fleet, list_seats), each median / max in ms.
async fn server_fn_times(node: &RunningNode) -> Result<((f64, f64), (f64, f64)), String> {
    let base = format!("http://{}", node.addr);
    let c = reqwest::Client::builder()
        .cookie_store(true)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| e.to_string())?;
    c.post(format!("{base}/login"))
        .form(&[("name", NAME), ("password", PASSWORD), ("next", "/")])
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for f in ["fleet", "list_seats"] {
        let mut t = Vec::new();
        for _ in 0..20 {
            let start = Instant::now();
            let r = c
                .post(format!("{base}/api/{f}"))
                .send()
                .await
                .map_err(|e| e.to_string())?;
            if !r.status().is_success() {
                return Err(format!("{f}: {}", r.status()));
            }
            r.bytes().await.map_err(|e| e.to_string())?;
            t.push(start.elapsed().as_secs_f64() * 1000.0);
        }
        out.push((median(t.clone()), max(&t)));
    }
    Ok((out[0], out[1]))
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command's closing parenthesis; utime and stime
    // are the 14th and 15th of the whole line.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// A node process's resident memory (`VmRSS`), in KiB.
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// What a node process with `seats` idle seats and no viewer reads as.
struct IdleNode {
    /// % of one core over `wall`, when a CPU window was asked for.
    cpu: Option<f64>,
    /// How long it took to hold every seat.
    held: Duration,
    wall: Duration,
    /// Resident memory once every seat was held (and after the window).
    rss_kib: u64,
}

/// A node process with `seats` idle seats and no viewer: how long it took
/// to hold them all, its CPU (% of one core) over `cpu_window` if one is
/// given, and its resident memory.
async fn idle_node(
    seats: usize,
    more: &str,
    cpu_window: Option<Duration>,
    scrape_every: Option<Duration>,
) -> Result<IdleNode, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let roles: String = (0..seats)
        .map(|i| format!("[[roles]]\nhandle = \"idle-{i:04}\"\n"))
        .collect();
    let file = dir.path().join("crewlet.toml");
    std::fs::write(
        &file,
        format!(
            "[node]\nid = \"bench-idle\"\nlisten = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n\n\
             [coordination]\nclaim_limit = 1000\n\n{more}\n{roles}\n\
             [[auth.users]]\nname = \"{NAME}\"\npassword_hash = \"{}\"\nrole = \"operator\"\n\n\
             [logging]\nformat = \"json\"\n",
            dir.path().join("data").display(),
            crewlet::web::auth::hash_password(PASSWORD).map_err(|e| e.to_string())?,
        ),
    )
    .map_err(|e| e.to_string())?;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_crewlet"))
        .args(["run", "--config"])
        .arg(&file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| e.to_string())?;
    let pid = child.id().ok_or("no pid")?;
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let started = Instant::now();
    let addr = loop {
        let line = stderr
            .next_line()
            .await
            .map_err(|e| e.to_string())?
            .ok_or("the node stopped before it started")?;
        if let Some(rest) = line.split("dashboard at http://").nth(1) {
            break rest.split('/').next().unwrap_or_default().to_string();
        }
    };
    // Keep reading its log so it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = stderr.next_line().await {} });
    let health = format!("http://{addr}/health");
    loop {
        let held = match reqwest::Client::new()
            .get(&health)
            .bearer_auth(TOKEN)
            .send()
            .await
        {
            Ok(r) => r.json::<Value>().await.ok(),
            Err(_) => None,
        };
        if held
            .as_ref()
            .and_then(|v| v["seats"].as_array())
            .map(Vec::len)
            == Some(seats)
        {
            break;
        }
        if started.elapsed() > Duration::from_secs(600) {
            return Err("the node did not hold every seat within 10 minutes".into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let all_held = started.elapsed();
    // Let the claims' aftermath (first flushes, presence) pass, then read.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (cpu, wall) = match cpu_window {
        Some(window) => {
            eprintln!(
                "the idle node holds {seats} seats; reading its CPU for {} s…",
                window.as_secs()
            );
            // A scraper, as Prometheus is one, for the window.
            let scraper = scrape_every.map(|every| {
                let url = format!("http://{addr}/metrics");
                tokio::spawn(async move {
                    let mut tick = tokio::time::interval(every);
                    loop {
                        tick.tick().await;
                        let scrape = reqwest::Client::new().get(&url).bearer_auth(TOKEN).send();
                        if let Ok(r) = scrape.await {
                            let _ = r.bytes().await;
                        }
                    }
                })
            });
            let before = cpu_ticks(pid).ok_or("cannot read /proc")?;
            let t0 = Instant::now();
            tokio::time::sleep(window).await;
            let after = cpu_ticks(pid).ok_or("cannot read /proc")?;
            if let Some(s) = scraper {
                s.abort();
            }
            let wall = t0.elapsed();
            // SAFETY: sysconf only reads a constant of the system.
            let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
            (
                Some((after - before) as f64 / hz / wall.as_secs_f64() * 100.0),
                wall,
            )
        }
        None => (None, Duration::ZERO),
    };
    let rss_kib = rss_kib(pid).ok_or("cannot read /proc")?;
    let _ = child.start_kill();
    let _ = child.wait().await;
    Ok(IdleNode {
        cpu,
        held: all_held,
        wall,
        rss_kib,
    })
}

fn ms(v: f64) -> String {
    if v.is_nan() {
        "—".into()
    } else if v >= 100.0 {
        format!("{v:.0} ms")
    } else {
        format!("{v:.1} ms")
    }
}

fn render_cells(runs: &[Value]) -> (String, String) {
    let col = |k: &str| {
        runs.iter()
            .filter_map(|r| r[k].as_f64())
            .collect::<Vec<_>>()
    };
    let rows = col("rows");
    let hydrated = col("hydrated");
    let html = col("html");
    let kb = median(col("bytes")) / 1024.0;
    (
        format!(
            "rows in the DOM: median {} / max {} (HTML received {}, {:.0} KiB)",
            ms(median(rows.clone())),
            ms(max(&rows)),
            ms(median(html)),
            kb
        ),
        format!(
            "hydrated: median {} / max {}",
            ms(median(hydrated.clone())),
            ms(max(&hydrated))
        ),
    )
}

fn main() {
    let site = site_root();
    if let Some(s) = &site {
        // SAFETY: no other thread runs yet.
        unsafe { std::env::set_var("CREWLET_SITE_ROOT", s) };
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let mut out = Vec::new();
        let dir = tempfile::tempdir().expect("tempdir");
        let seeding = Instant::now();
        let node = seeded_node(dir.path()).await;
        eprintln!(
            "seeded {NODES} nodes and {SEATS} seats in {:.1} s; site: {}",
            seeding.elapsed().as_secs_f64(),
            site.as_ref()
                .map(|s| s.display().to_string())
                .unwrap_or_else(|| "none".into())
        );
        let browser = match &site {
            None => Err("the browser half is not built (./dev build)".to_string()),
            Some(_) => browser_rows(&node).await,
        };
        let functions = server_fn_times(&node).await;
        node.shutdown().await.expect("the node stops");
        match browser {
            Ok(b) => {
                let (rows, hydrated) = render_cells(&b.nodes);
                out.push(format!(
                    "| Settings › Nodes, first render, {NODES} nodes / {SEATS} seats ({} loads) | {rows}; {hydrated} | ≤ 1 s (rows) |",
                    b.nodes.len()
                ));
                let (rows, hydrated) = render_cells(&b.seats);
                out.push(format!(
                    "| Seats, first render, {SEATS} seats ({} loads) | {rows}; {hydrated} | ≤ 1 s (rows) |",
                    b.seats.len()
                ));
                let (rows, hydrated) = render_cells(&b.seat_page);
                out.push(format!(
                    "| a seat's page, first render, {} events about it kept ({} loads) | {rows}; {hydrated} | ≤ 1 s (rows) |",
                    b.story_kept,
                    b.seat_page.len()
                ));
                for (page, v) in [
                    ("Events page (the event is a row)", b.events_ms),
                    ("Seats page (the row is read again)", b.seats_ms),
                ] {
                    let mut v = v;
                    v.sort_by(|a, b| a.total_cmp(b));
                    out.push(format!(
                        "| event emitted → DOM, {page}, {} events, {SEATS} seats | p50 {} / p99 {} / max {} | p99 ≤ 100 ms |",
                        v.len(),
                        ms(percentile(&v, 0.5)),
                        ms(percentile(&v, 0.99)),
                        ms(max(&v))
                    ));
                }
            }
            Err(why) => out.push(format!(
                "| browser rows (first render, event → DOM) | skipped: {why} | — |"
            )),
        }
        match functions {
            Ok(((f50, fmax), (s50, smax))) => out.push(format!(
                "| the pages' reads over HTTP, {NODES} nodes / {SEATS} seats (20 each) | fleet: median {} / max {}; list_seats: median {} / max {} | — |",
                ms(f50),
                ms(fmax),
                ms(s50),
                ms(smax)
            )),
            Err(why) => out.push(format!("| the pages' reads over HTTP | failed: {why} | — |")),
        }
        let window = Duration::from_secs(env_number("CREWLET_BENCH_CPU_SECONDS", 30) as u64);
        let mut rss_full = None;
        for (what, more, scrape) in [
            ("", "", None),
            (
                ", GET /metrics every 5 s (a Prometheus scrape)",
                "",
                Some(Duration::from_secs(5)),
            ),
            (
                ", memory changelog cycle off (`memory.flush_seconds = 3600`), for comparison",
                "[memory]\nflush_seconds = 3600\n",
                None,
            ),
        ] {
            match idle_node(IDLE_SEATS, more, Some(window), scrape).await {
                Ok(n) => {
                    rss_full = rss_full.or(Some(n.rss_kib));
                    out.push(format!(
                        "| node CPU, no viewer, {IDLE_SEATS} idle seats{what} (all held after {:.0} s; sampled {:.0} s) | {:.2} % of one core | ≤ 1 % |",
                        n.held.as_secs_f64(),
                        n.wall.as_secs_f64(),
                        n.cpu.unwrap_or(f64::NAN)
                    ))
                }
                Err(why) => out.push(format!(
                    "| node CPU, no viewer, {IDLE_SEATS} idle seats{what} | failed: {why} | ≤ 1 % |"
                )),
            }
        }
        // Resident memory per held seat: the node above against the same
        // node holding FEW_SEATS.
        match (rss_full, idle_node(FEW_SEATS, "", None, None).await) {
            (Some(full), Ok(few)) => out.push(format!(
                "| node resident memory per held seat ({IDLE_SEATS} idle seats against {FEW_SEATS}) | {:.1} KiB a seat (RSS {:.1} MiB with {IDLE_SEATS}, {:.1} MiB with {FEW_SEATS}) | — |",
                (full as f64 - few.rss_kib as f64) / (IDLE_SEATS - FEW_SEATS) as f64,
                full as f64 / 1024.0,
                few.rss_kib as f64 / 1024.0
            )),
            (None, _) => out.push(format!(
                "| node resident memory per held seat | failed: the {IDLE_SEATS}-seat node did not run | — |"
            )),
            (_, Err(why)) => out.push(format!(
                "| node resident memory per held seat | failed: {why} | — |"
            )),
        }
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout);
        let _ = writeln!(stdout, "| dashboard (loopback, headless Chromium) | measured | goal |");
        let _ = writeln!(stdout, "|---|---|---|");
        for row in out {
            let _ = writeln!(stdout, "{row}");
        }
    });
}
