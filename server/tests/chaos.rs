//! Chaos: a real fleet (3-server NATS cluster, real `crewlet` processes)
//! under a seeded schedule of faults — kill -9, SIGSTOP past the TTL, NATS
//! server restarts (the leases' leader and a follower), a node cut off
//! from NATS by a blackholing proxy, drains, a rolling restart, a node at
//! an older lease protocol, applies that remove and re-add roles — while a
//! publisher feeds every seat; then the recording is checked
//! (docs/testing.md § Chaos testing).
//!
//! - `ci_profile_holds_every_invariant` runs in `cargo test` (and so in
//!   `./dev test`): every fault kind once, seed `CHAOS_SEED` (default 1).
//! - `soak` (ignored; `./dev chaos --profile soak`) runs `CHAOS_RUNS`
//!   schedules (default 100) from seed `CHAOS_SEED` on, each on a fresh
//!   cluster and fleet, and prints the summary after each.
//!
//! A run's recording — every node's log, the event bus, the findings — is
//! kept under `target/tmp/chaos/` (a failed run always; a passing one with
//! `CHAOS_KEEP=1`).

#[path = "it/support/mod.rs"]
mod support;

#[path = "chaos/check.rs"]
mod check;
#[path = "chaos/harness.rs"]
mod harness;
#[path = "chaos/proxy.rs"]
mod proxy;
#[path = "chaos/schedule.rs"]
mod schedule;

use std::path::PathBuf;

use harness::Outcome;
use schedule::{KINDS, Schedule};

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

fn run_dir(profile: &str, seed: u64) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("chaos")
        .join(format!("{profile}-{seed}"))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

fn dur(us: i64) -> String {
    format!("{:.1} s", us as f64 / 1e6)
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The summary table: one row per run and, for more than one, a total.
fn summary(outcomes: &[Outcome]) -> String {
    let mut s = String::new();
    s.push_str("\n| seed | faults | messages | effects | duplicates (bounded) | lost | dead-lettered | max dark | p99 dark | violations | wall |\n");
    s.push_str("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    let faults = |m: &std::collections::BTreeMap<&'static str, usize>| {
        KINDS
            .iter()
            .filter_map(|k| m.get(k).map(|n| format!("{k} {n}")))
            .chain(
                m.iter()
                    .filter(|(k, _)| !KINDS.contains(k))
                    .map(|(k, n)| format!("{k} {n}")),
            )
            .collect::<Vec<_>>()
            .join(", ")
    };
    for o in outcomes {
        let st = &o.findings.stats;
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} ({}) | {} | {} | {} | {} | {} | {:.0} s |\n",
            o.seed,
            faults(&o.faults),
            st.messages,
            st.effects,
            st.duplicates,
            st.bounded_duplicates,
            lost_cell(st.lost, st.unanswered),
            st.dead_lettered,
            dur(st.max_dark_us),
            dur(st.p99_dark_us),
            o.findings.violations.len(),
            o.wall.as_secs_f64()
        ));
    }
    if outcomes.len() > 1 {
        let mut all = std::collections::BTreeMap::new();
        for o in outcomes {
            for (k, n) in &o.faults {
                *all.entry(*k).or_insert(0) += n;
            }
        }
        let sum = |f: &dyn Fn(&Outcome) -> usize| outcomes.iter().map(f).sum::<usize>();
        let mut dark: Vec<i64> = outcomes.iter().flat_map(|o| o.dark.clone()).collect();
        dark.sort();
        s.push_str(&format!(
            "| **{} runs** | {} | {} | {} | {} ({}) | {} | {} | {} | {} | {} | {:.0} s |\n",
            outcomes.len(),
            faults(&all),
            sum(&|o| o.findings.stats.messages),
            sum(&|o| o.findings.stats.effects),
            sum(&|o| o.findings.stats.duplicates),
            sum(&|o| o.findings.stats.bounded_duplicates),
            lost_cell(
                sum(&|o| o.findings.stats.lost),
                sum(&|o| o.findings.stats.unanswered)
            ),
            sum(&|o| o.findings.stats.dead_lettered),
            dur(dark.last().copied().unwrap_or(0)),
            dur(percentile(&dark, 0.99)),
            sum(&|o| o.findings.violations.len()),
            outcomes.iter().map(|o| o.wall.as_secs_f64()).sum::<f64>()
        ));
    }
    let stops75: usize = outcomes.iter().map(|o| o.findings.stats.stops_exit75).sum();
    let fenced: usize = outcomes.iter().map(|o| o.findings.stats.stops_fenced).sum();
    let zombies: usize = outcomes
        .iter()
        .map(|o| o.findings.stats.zombie_effects)
        .sum();
    let overlap = outcomes
        .iter()
        .map(|o| o.findings.stats.max_overlap_us)
        .max()
        .unwrap_or(0);
    let latency = outcomes
        .iter()
        .map(|o| o.findings.stats.max_latency_us)
        .max()
        .unwrap_or(0);
    let unconfirmed: usize = outcomes.iter().map(|o| o.findings.stats.unconfirmed).sum();
    let handoffs: usize = outcomes.iter().map(|o| o.memory_handoffs).sum();
    let crashes: usize = outcomes.iter().map(|o| o.memory_crashes).sum();
    let late_delay = outcomes
        .iter()
        .map(|o| o.findings.stats.late_max_delay_us)
        .max()
        .unwrap_or(0);
    let late_per_turn = outcomes
        .iter()
        .map(|o| o.findings.stats.late_most_per_turn)
        .max()
        .unwrap_or(0);
    let late_bound = outcomes
        .first()
        .map_or(0, |o| o.findings.stats.late_bound_us);
    let recovered: usize = outcomes.iter().map(|o| o.recovered).sum();
    let republished: usize = outcomes.iter().map(|o| o.republished).sum();
    s.push_str(&format!(
        "\nnodes stopped past the TTL: {stops75} exited 75, {fenced} resumed fenced; \
         effects posted by a holder after a newer epoch was claimed: {zombies} \
         (each from a call that passed the fence before the claim; at most {late_per_turn} per turn; \
         stored at most {} after the check, outside stops and cut-offs, bound {}); \
         longest overlap of two attachments (outside a stop): {}; \
         slowest message (publish → first effect): {}; \
         publishes never acknowledged: {unconfirmed}; \
         graceful handoffs with memory checked: {handoffs}; \
         other tenure ends with memory checked against the crash bound: {crashes}; \
         stranded messages taken from the stream: {recovered}; \
         acknowledged publishes not kept, published again: {republished}\n",
        dur(late_delay),
        dur(late_bound),
        dur(overlap),
        dur(latency)
    ));
    s
}

fn report(o: &Outcome) {
    for n in &o.notes {
        println!("  note: {n}");
    }
    for b in &o.findings.bounded {
        println!("  bounded (documented): {b}");
    }
    for v in &o.findings.violations {
        println!("  VIOLATION: {v}");
    }
    for s in &o.findings.stories {
        println!("  story of {s}");
    }
}

fn keep(o: &Outcome) {
    if o.findings.violations.is_empty() && std::env::var("CHAOS_KEEP").as_deref() != Ok("1") {
        let _ = std::fs::remove_dir_all(&o.dir);
    } else {
        println!("  recording kept in {}", o.dir.display());
    }
}

#[test]
fn ci_profile_holds_every_invariant() {
    let seed = env_u64("CHAOS_SEED").unwrap_or(1);
    let sched = Schedule::ci(seed);
    let o = runtime().block_on(harness::run(sched, run_dir("ci", seed)));
    report(&o);
    println!("{}", summary(std::slice::from_ref(&o)));
    let violations = o.findings.violations.clone();
    keep(&o);
    assert!(
        violations.is_empty(),
        "CHAOS_SEED={seed}: {} violations (recording in {}):\n{}",
        violations.len(),
        o.dir.display(),
        violations.join("\n")
    );
}

/// Chaos seed 5004 lost one message (acknowledged, no effect, not
/// dead-lettered) while its seat's holder, a node at a lower lease
/// protocol, drained and a NATS follower restarted. Those faults, kept as
/// a scenario: nothing lost, nothing run twice, every invariant held.
/// `CHAOS_RUNS` runs it that many times (seeds from `CHAOS_SEED`).
#[test]
fn a_lower_protocol_holder_draining_during_a_nats_follower_restart_loses_nothing() {
    let first = env_u64("CHAOS_SEED").unwrap_or(5004);
    let runs = env_u64("CHAOS_RUNS").unwrap_or(1);
    let rt = runtime();
    let mut outcomes = Vec::new();
    for seed in first..first + runs {
        let sched = Schedule::old_holder_drains_in_nats_restart(seed);
        let o = rt.block_on(harness::run(sched, run_dir("seed5004", seed)));
        report(&o);
        keep(&o);
        outcomes.push(o);
    }
    println!("{}", summary(&outcomes));
    let failed: Vec<String> = outcomes
        .iter()
        .filter(|o| {
            let st = &o.findings.stats;
            !o.findings.violations.is_empty() || st.lost > 0 || st.unanswered > 0
        })
        .map(|o| {
            format!(
                "CHAOS_SEED={}: {}",
                o.seed,
                o.findings.violations.join(" | ")
            )
        })
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

#[test]
#[ignore = "the soak: ./dev chaos --profile soak (CHAOS_RUNS schedules, about a minute each)"]
fn soak() {
    let first = env_u64("CHAOS_SEED").unwrap_or(1000);
    let runs = env_u64("CHAOS_RUNS").unwrap_or(100);
    let rt = runtime();
    let mut outcomes = Vec::new();
    let mut broken = Vec::new();
    for seed in first..first + runs {
        // A run the harness itself could not carry out (it panicked) is
        // listed, the soak goes on with the next seed, and it fails at the
        // end: a schedule not run proves nothing.
        let run = rt.block_on(async {
            tokio::spawn(harness::run(Schedule::soak(seed), run_dir("soak", seed))).await
        });
        let o = match run {
            Ok(o) => o,
            Err(e) => {
                println!("CHAOS_SEED={seed}: the harness could not run this schedule: {e}");
                broken.push(format!("CHAOS_SEED={seed}: {e}"));
                continue;
            }
        };
        report(&o);
        keep(&o);
        outcomes.push(o);
        println!("{}", summary(&outcomes));
    }
    if !broken.is_empty() {
        println!("schedules the harness could not run: {}", broken.join("; "));
    }
    let failed: Vec<String> = outcomes
        .iter()
        .filter(|o| !o.findings.violations.is_empty())
        .map(|o| {
            format!(
                "CHAOS_SEED={} ({}): {}",
                o.seed,
                o.dir.display(),
                o.findings.violations.join(" | ")
            )
        })
        .chain(broken)
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// The summary's "lost" cell: the lost, and those still stored unanswered
/// at the end when there are any.
fn lost_cell(lost: usize, unanswered: usize) -> String {
    match unanswered {
        0 => lost.to_string(),
        u => format!("{lost} (+{u} unanswered)"),
    }
}
