//! The node's metrics: the process's recorder (the `metrics` facade over
//! `metrics-exporter-prometheus`), what `GET /metrics` renders, every
//! family's name, unit and help text, and [`Update`] — one change to one
//! series, as plain data — so that what moves a metric is decided by pure
//! functions (`events::metric_updates`) and applied here.
//!
//! One process is one node: every series carries the global label `node`
//! (the first node started in the process names it). Label sets are
//! bounded: outcomes, dispositions, reasons and routes are closed lists;
//! a tool call's `tool` is one the company's roles are given (the built-in
//! tools and what their tool servers list); seat handles label only the
//! per-seat inbox depth, and only while the company has at most
//! `metrics.seat_series_limit` seats.

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Claims of seats (a handoff's take of an offered seat included), by
/// `outcome`: `won`, `held_by_peer` (a live lease
/// was found), `store_error` (the store did not answer: unknown ownership
/// is not ownership), `protocol_gate` (this pass's claims refused by the
/// protocol gate), `withheld` (a pass that claimed nothing on purpose).
pub const CLAIMS: &str = "crewlet_claims_total";
/// How long a won claim's store calls took (seconds).
pub const CLAIM_DURATION: &str = "crewlet_claim_duration_seconds";
/// Seat renewals, by `outcome`: `renewed`, `lost` (the tenure is over),
/// `store_unreachable` (the store did not answer: the seat is kept, its
/// inbox quiesced).
pub const RENEWALS: &str = "crewlet_renewals_total";
/// How long a read of the live lease view waited for the view to be level
/// with the bucket's last write.
pub const LEASE_VIEW_CATCH_UP: &str = "crewlet_lease_view_catch_up_seconds";
/// How many revisions the live lease view was behind the bucket's last
/// write when it was last read.
pub const LEASE_VIEW_LAG: &str = "crewlet_lease_view_lag_revisions";
/// How long a placement pass took.
pub const SWEEP_DURATION: &str = "crewlet_sweep_duration_seconds";
/// Seats one placement pass claimed.
pub const SWEEP_CLAIMS: &str = "crewlet_sweep_claims";
/// Seats one placement pass gave back.
pub const SWEEP_RELEASES: &str = "crewlet_sweep_releases";
/// Mail waiting in the inboxes of the seats this node holds (unacknowledged
/// included), read on the sweep's cadence.
pub const INBOX_DEPTH: &str = "crewlet_inbox_depth_messages";
/// The same, by `seat` (only while the company has at most
/// `metrics.seat_series_limit` seats).
pub const SEAT_INBOX_DEPTH: &str = "crewlet_seat_inbox_depth_messages";
/// Memory changelog flushes, by `outcome` (`ok`, `failed`).
pub const MEMORY_FLUSHES: &str = "crewlet_memory_flushes_total";
/// How long a memory changelog flush took.
pub const MEMORY_FLUSH_DURATION: &str = "crewlet_memory_flush_duration_seconds";
/// Memory rows a flush published.
pub const MEMORY_FLUSHED_ROWS: &str = "crewlet_memory_flushed_rows_total";
/// Memory hydrations (a seat's memory replayed as it is established), by
/// `outcome` (`ok`, `failed`).
pub const MEMORY_HYDRATIONS: &str = "crewlet_memory_hydrations_total";
/// How long a hydration took.
pub const MEMORY_HYDRATE_DURATION: &str = "crewlet_memory_hydrate_duration_seconds";
/// Memory rows a hydration replayed, by `result` (`inserted`,
/// `kept_local`, `vector_taken`, `replaced`, `collided`, `unreadable`).
pub const MEMORY_HYDRATED_ROWS: &str = "crewlet_memory_hydrated_rows_total";
/// Reads of a seat's memory, by `answer`: `held` (its holder answered),
/// `unheld` (no node holds it), `unavailable` (its holder could not).
pub const MEMORY_READS: &str = "crewlet_memory_reads_total";
/// Seats given back, by `reason` (drain, rebalance, lost, …).
pub const RELEASES: &str = "crewlet_seat_releases_total";
/// How long the coordination store's primitives took, by `op` (get,
/// create, update, delete, written_at, last_revision, revision_exists,
/// purge, watch).
pub const STORE_DURATION: &str = "crewlet_store_call_duration_seconds";
/// Store primitives that failed, by `op`.
pub const STORE_ERRORS: &str = "crewlet_store_errors_total";
/// Seats this node holds (read at each scrape).
pub const SEATS_HELD: &str = "crewlet_seats_held";
/// Seats whose teardown could not be proven (undead; read at each scrape).
pub const SEATS_UNPROVEN: &str = "crewlet_seats_unproven";
/// How long the oldest unproven teardown has been failing.
pub const UNPROVEN_OLDEST: &str = "crewlet_seat_unproven_oldest_seconds";
/// Seats no live node may run, as of this node's last placement pass.
pub const SEATS_UNPLACEABLE: &str = "crewlet_seats_unplaceable";
/// Placement passes.
pub const SWEEPS: &str = "crewlet_sweeps_total";
/// Handoffs, by `outcome`: `taken` (counted by the taker), `withdrawn`
/// (by the giver).
pub const HANDOFFS: &str = "crewlet_handoffs_total";
/// How long no turn could be admitted during a handoff.
pub const HANDOFF_DARK: &str = "crewlet_handoff_dark_seconds";
/// Turns, by `outcome`: `completed`, `broken_redelivered` (broke; its
/// mail handed back), `broken_recorded` (broke after reaching outside;
/// recorded, never run again), `broken_dead_lettered`, `fenced`,
/// `stopped`, `parked`, `panicked`.
/// Triggers the ledger skips are [`TRIGGERS_SKIPPED`].
pub const TURNS: &str = "crewlet_turns_total";
/// How long turns ran.
pub const TURN_DURATION: &str = "crewlet_turn_duration_seconds";
/// Rounds per turn.
pub const TURN_ROUNDS: &str = "crewlet_turn_rounds";
/// Tool calls the engine executed for turns, by `tool` and `outcome`
/// (`ok`, `failed`, `refused`, `parked`).
pub const TOOL_CALLS: &str = "crewlet_tool_calls_total";
/// Tokens the model agents' completions spent.
pub const TOKENS: &str = "crewlet_model_tokens_total";
/// Triggers that will not run (again), by `reason`.
pub const TRIGGERS_SKIPPED: &str = "crewlet_triggers_skipped_total";
/// Deliveries by `disposition`: `ack`, `nak`, `retry`, `defer`,
/// `dead_letter`, `recovered`, `republished`.
pub const DELIVERIES: &str = "crewlet_deliveries_total";
/// Dead letters kept (the fleet's), read at each scrape.
pub const DEAD_LETTERS: &str = "crewlet_dead_letters";
/// HTTP requests, by `route` (the matched route; `unmatched` else) and
/// `status`.
pub const HTTP_REQUESTS: &str = "crewlet_http_requests_total";
/// How long HTTP requests took, by `route`.
pub const HTTP_DURATION: &str = "crewlet_http_request_duration_seconds";
/// Sign-in attempts, by `outcome`: `ok`, `refused`, `limited`, `busy`.
pub const SIGN_INS: &str = "crewlet_sign_ins_total";
/// Event streams (`GET /api/events`) open now.
pub const EVENT_STREAMS: &str = "crewlet_event_streams";
/// Tool servers that failed to start or exited.
pub const TOOL_SERVER_FAILURES: &str = "crewlet_tool_server_failures_total";

/// The buckets of every `…_seconds` histogram.
const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];
/// The buckets of the rounds per turn.
const ROUNDS_BUCKETS: &[f64] = &[1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0, 50.0];
/// The buckets of the seats a pass claims or gives back.
const PASS_BUCKETS: &[f64] = &[0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 64.0];

/// One change to one series.
#[derive(Clone, Debug, PartialEq)]
pub enum Update {
    /// Add `by` to a counter.
    Count {
        name: &'static str,
        labels: Vec<(&'static str, String)>,
        by: u64,
    },
    /// Record one value of a histogram.
    Observe {
        name: &'static str,
        labels: Vec<(&'static str, String)>,
        value: f64,
    },
    /// Set a gauge.
    Set { name: &'static str, value: f64 },
    /// Set one series of a labelled gauge.
    SetLabelled {
        name: &'static str,
        labels: Vec<(&'static str, String)>,
        value: f64,
    },
}

impl Update {
    /// One more of counter `name` with one label.
    pub fn count(name: &'static str, label: &'static str, value: impl Into<String>) -> Update {
        Update::Count {
            name,
            labels: vec![(label, value.into())],
            by: 1,
        }
    }

    /// One more of counter `name` with two labels.
    pub fn count2(
        name: &'static str,
        a: (&'static str, String),
        b: (&'static str, String),
    ) -> Update {
        Update::Count {
            name,
            labels: vec![a, b],
            by: 1,
        }
    }

    /// A histogram value with no label.
    pub fn observe(name: &'static str, value: f64) -> Update {
        Update::Observe {
            name,
            labels: Vec::new(),
            value,
        }
    }

    /// A histogram value in seconds from a duration in milliseconds.
    pub fn seconds_from_ms(name: &'static str, ms: u64) -> Update {
        Update::Observe {
            name,
            labels: Vec::new(),
            value: ms as f64 / 1000.0,
        }
    }
}

/// Apply `u` to the process's recorder (nothing before one is installed).
pub fn apply(u: &Update) {
    let pairs = |labels: &[(&'static str, String)]| -> Vec<metrics::Label> {
        labels
            .iter()
            .map(|(k, v)| metrics::Label::new(*k, v.clone()))
            .collect()
    };
    match u {
        Update::Count { name, labels, by } => {
            metrics::counter!(*name, pairs(labels)).increment(*by);
        }
        Update::Observe {
            name,
            labels,
            value,
        } => {
            metrics::histogram!(*name, pairs(labels)).record(*value);
        }
        Update::Set { name, value } => {
            metrics::gauge!(*name).set(*value);
        }
        Update::SetLabelled {
            name,
            labels,
            value,
        } => {
            metrics::gauge!(*name, pairs(labels)).set(*value);
        }
    }
}

/// The store call latencies (seconds) noted since they were last taken, at
/// most [`LATENCIES_KEPT`] (later ones replace earlier ones in turn): what
/// the node's trend reads its store p99 from each minute. One process is
/// one node, as for the recorder.
static LATENCIES: std::sync::Mutex<(Vec<f64>, u64)> = std::sync::Mutex::new((Vec::new(), 0));
/// How many latencies a minute keeps.
pub const LATENCIES_KEPT: usize = 4_096;

/// Note one store call's latency.
pub fn note_store_latency(seconds: f64) {
    let mut l = LATENCIES.lock().unwrap_or_else(|e| e.into_inner());
    let (kept, seen) = &mut *l;
    if kept.len() < LATENCIES_KEPT {
        kept.push(seconds);
    } else {
        kept[(*seen as usize) % LATENCIES_KEPT] = seconds;
    }
    *seen += 1;
}

/// The latencies noted since the last take, emptied.
pub fn take_store_latencies() -> Vec<f64> {
    let mut l = LATENCIES.lock().unwrap_or_else(|e| e.into_inner());
    l.1 = 0;
    std::mem::take(&mut l.0)
}

/// Pure: the 99th percentile of `values` (nearest rank); `None` for none.
pub fn p99(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((v.len() as f64) * 0.99).ceil() as usize;
    v.get(rank.clamp(1, v.len()) - 1).copied()
}

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Install the process's recorder, its series labelled `node = node_id`
/// (once per process: a later call keeps the first). `None` when another
/// recorder was installed first.
pub fn install(node_id: &str) -> Option<&'static PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let built = PrometheusBuilder::new()
                .add_global_label("node", node_id)
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
                .and_then(|b| b.set_buckets_for_metric(Matcher::Full(TURN_ROUNDS.into()), ROUNDS_BUCKETS))
                .and_then(|b| b.set_buckets_for_metric(Matcher::Full(SWEEP_CLAIMS.into()), PASS_BUCKETS))
                .and_then(|b| b.set_buckets_for_metric(Matcher::Full(SWEEP_RELEASES.into()), PASS_BUCKETS))
                .map_err(|e| e.to_string())
                .and_then(|b| b.install_recorder().map_err(|e| e.to_string()));
            match built {
                Ok(handle) => {
                    describe();
                    Some(handle)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the metrics recorder cannot be installed; GET /metrics serves the node's gauges only");
                    None
                }
            }
        })
        .as_ref()
}

/// The exposition of every series (empty before [`install`]).
pub fn render() -> String {
    HANDLE
        .get()
        .and_then(Option::as_ref)
        .map(PrometheusHandle::render)
        .unwrap_or_default()
}

/// Keep the recorder's histograms bounded; run every [`UPKEEP_EVERY`].
pub fn upkeep() {
    if let Some(h) = HANDLE.get().and_then(Option::as_ref) {
        h.run_upkeep();
    }
}

/// How often [`upkeep`] runs.
pub const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// A family's kind, for [`FAMILIES`].
#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Every family: its kind, name, unit and help text.
const FAMILIES: &[(Kind, &str, metrics::Unit, &str)] = {
    use metrics::Unit;
    &[
        (
            Kind::Counter,
            CLAIMS,
            Unit::Count,
            "Seat claims, by outcome (won, held_by_peer, store_error, protocol_gate, withheld).",
        ),
        (
            Kind::Histogram,
            CLAIM_DURATION,
            Unit::Seconds,
            "How long won seat claims' store calls took.",
        ),
        (
            Kind::Counter,
            RENEWALS,
            Unit::Count,
            "Seat renewals, by outcome (renewed, lost, store_unreachable).",
        ),
        (
            Kind::Histogram,
            LEASE_VIEW_CATCH_UP,
            Unit::Seconds,
            "How long a read of the live lease view waited for it to be level with the bucket.",
        ),
        (
            Kind::Gauge,
            LEASE_VIEW_LAG,
            Unit::Count,
            "Revisions the live lease view was behind the bucket at its last read.",
        ),
        (
            Kind::Histogram,
            SWEEP_DURATION,
            Unit::Seconds,
            "How long placement passes took.",
        ),
        (
            Kind::Histogram,
            SWEEP_CLAIMS,
            Unit::Count,
            "Seats one placement pass claimed.",
        ),
        (
            Kind::Histogram,
            SWEEP_RELEASES,
            Unit::Count,
            "Seats one placement pass gave back.",
        ),
        (
            Kind::Gauge,
            INBOX_DEPTH,
            Unit::Count,
            "Mail waiting in the inboxes of the seats this node holds (read on the sweep's cadence).",
        ),
        (
            Kind::Gauge,
            SEAT_INBOX_DEPTH,
            Unit::Count,
            "Mail waiting in one seat's inbox, by seat (small companies only).",
        ),
        (
            Kind::Counter,
            MEMORY_FLUSHES,
            Unit::Count,
            "Memory changelog flushes, by outcome.",
        ),
        (
            Kind::Histogram,
            MEMORY_FLUSH_DURATION,
            Unit::Seconds,
            "How long memory changelog flushes took.",
        ),
        (
            Kind::Counter,
            MEMORY_FLUSHED_ROWS,
            Unit::Count,
            "Memory rows flushes published.",
        ),
        (
            Kind::Counter,
            MEMORY_HYDRATIONS,
            Unit::Count,
            "Memory hydrations, by outcome.",
        ),
        (
            Kind::Histogram,
            MEMORY_HYDRATE_DURATION,
            Unit::Seconds,
            "How long memory hydrations took.",
        ),
        (
            Kind::Counter,
            MEMORY_HYDRATED_ROWS,
            Unit::Count,
            "Memory rows hydrations replayed, by result.",
        ),
        (
            Kind::Counter,
            MEMORY_READS,
            Unit::Count,
            "Reads of a seat's memory, by answer (held, unheld, unavailable).",
        ),
        (
            Kind::Counter,
            RELEASES,
            Unit::Count,
            "Seats given back, by reason.",
        ),
        (
            Kind::Histogram,
            STORE_DURATION,
            Unit::Seconds,
            "How long the coordination store's primitives took, by op.",
        ),
        (
            Kind::Counter,
            STORE_ERRORS,
            Unit::Count,
            "Coordination store primitives that failed, by op.",
        ),
        (
            Kind::Gauge,
            SEATS_HELD,
            Unit::Count,
            "Seats this node holds and runs.",
        ),
        (
            Kind::Gauge,
            SEATS_UNPROVEN,
            Unit::Count,
            "Seats whose teardown could not be proven (undead).",
        ),
        (
            Kind::Gauge,
            UNPROVEN_OLDEST,
            Unit::Seconds,
            "How long the oldest unproven teardown has been failing.",
        ),
        (
            Kind::Gauge,
            SEATS_UNPLACEABLE,
            Unit::Count,
            "Seats no live node may run (this node's last placement pass).",
        ),
        (Kind::Counter, SWEEPS, Unit::Count, "Placement passes."),
        (
            Kind::Counter,
            HANDOFFS,
            Unit::Count,
            "Handoffs, by outcome (taken, withdrawn).",
        ),
        (
            Kind::Histogram,
            HANDOFF_DARK,
            Unit::Seconds,
            "How long no turn could be admitted during a handoff.",
        ),
        (
            Kind::Counter,
            TURNS,
            Unit::Count,
            "Turns, by outcome (completed, broken_redelivered, broken_recorded, broken_dead_lettered, fenced, stopped, parked, panicked).",
        ),
        (
            Kind::Histogram,
            TURN_DURATION,
            Unit::Seconds,
            "How long turns ran.",
        ),
        (
            Kind::Histogram,
            TURN_ROUNDS,
            Unit::Count,
            "Rounds per turn.",
        ),
        (
            Kind::Counter,
            TOOL_CALLS,
            Unit::Count,
            "Tool calls the engine executed for turns, by tool and outcome.",
        ),
        (
            Kind::Counter,
            TOKENS,
            Unit::Count,
            "Tokens the model agents' completions spent.",
        ),
        (
            Kind::Counter,
            TRIGGERS_SKIPPED,
            Unit::Count,
            "Triggers that will not run (again), by reason.",
        ),
        (
            Kind::Counter,
            DELIVERIES,
            Unit::Count,
            "Deliveries, by disposition.",
        ),
        (Kind::Gauge, DEAD_LETTERS, Unit::Count, "Dead letters kept."),
        (
            Kind::Counter,
            HTTP_REQUESTS,
            Unit::Count,
            "HTTP requests, by route and status.",
        ),
        (
            Kind::Histogram,
            HTTP_DURATION,
            Unit::Seconds,
            "How long HTTP requests took, by route.",
        ),
        (
            Kind::Counter,
            SIGN_INS,
            Unit::Count,
            "Sign-in attempts, by outcome.",
        ),
        (
            Kind::Gauge,
            EVENT_STREAMS,
            Unit::Count,
            "Event streams open now.",
        ),
        (
            Kind::Counter,
            TOOL_SERVER_FAILURES,
            Unit::Count,
            "Tool servers that failed to start or exited.",
        ),
    ]
};

/// The help text and unit of every family.
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    for &(kind, name, unit, help) in FAMILIES {
        match kind {
            Kind::Counter => describe_counter!(name, unit, help),
            Kind::Gauge => describe_gauge!(name, unit, help),
            Kind::Histogram => describe_histogram!(name, unit, help),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p99_is_the_nearest_rank_and_none_of_nothing() {
        assert_eq!(p99(&[]), None);
        assert_eq!(p99(&[0.5]), Some(0.5));
        let hundred: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(p99(&hundred), Some(99.0));
        let mut two_hundred: Vec<f64> = (1..=200).rev().map(f64::from).collect();
        two_hundred.push(1000.0);
        assert_eq!(p99(&two_hundred), Some(199.0));
    }
}
