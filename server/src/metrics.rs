//! The node's metrics: the process's recorder (the `metrics` facade over
//! `metrics-exporter-prometheus`), what `GET /metrics` renders, every
//! family's name, unit and help text, and [`Update`] — one change to one
//! series, as plain data — so that what moves a metric is decided by pure
//! functions (`events::metric_updates`) and applied here.
//!
//! One process is one node: every series carries the global label `node`
//! (the first node started in the process names it). Label sets are
//! bounded: outcomes, dispositions, reasons and routes are closed lists;
//! seat handles label no series.

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Claims of seats, by `outcome`: `won`, `protocol_gate` (this pass's
/// claims refused by the protocol gate), `withheld` (a pass that claimed
/// nothing on purpose).
pub const CLAIMS: &str = "crewlet_claims_total";
/// Renewals that failed, by `outcome`: `store_unreachable` (the store did
/// not answer: the seat is kept, its inbox quiesced).
pub const RENEWALS: &str = "crewlet_renewals_total";
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
/// Turns, by `outcome`: completed, failed, fenced, stopped, parked,
/// panicked.
pub const TURNS: &str = "crewlet_turns_total";
/// How long turns ran.
pub const TURN_DURATION: &str = "crewlet_turn_duration_seconds";
/// Rounds per turn.
pub const TURN_ROUNDS: &str = "crewlet_turn_rounds";
/// Tool calls the engine executed for turns.
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
    }
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

/// The help text and unit of every family.
fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        CLAIMS,
        Unit::Count,
        "Seat claims, by outcome (won, protocol_gate, withheld)."
    );
    describe_counter!(
        RENEWALS,
        Unit::Count,
        "Seat renewals that failed, by outcome (store_unreachable)."
    );
    describe_counter!(RELEASES, Unit::Count, "Seats given back, by reason.");
    describe_histogram!(
        STORE_DURATION,
        Unit::Seconds,
        "How long the coordination store's primitives took, by op."
    );
    describe_counter!(
        STORE_ERRORS,
        Unit::Count,
        "Coordination store primitives that failed, by op."
    );
    describe_gauge!(SEATS_HELD, Unit::Count, "Seats this node holds and runs.");
    describe_gauge!(
        SEATS_UNPROVEN,
        Unit::Count,
        "Seats whose teardown could not be proven (undead)."
    );
    describe_gauge!(
        UNPROVEN_OLDEST,
        Unit::Seconds,
        "How long the oldest unproven teardown has been failing."
    );
    describe_gauge!(
        SEATS_UNPLACEABLE,
        Unit::Count,
        "Seats no live node may run (this node's last placement pass)."
    );
    describe_counter!(SWEEPS, Unit::Count, "Placement passes.");
    describe_counter!(
        HANDOFFS,
        Unit::Count,
        "Handoffs, by outcome (taken, withdrawn)."
    );
    describe_histogram!(
        HANDOFF_DARK,
        Unit::Seconds,
        "How long no turn could be admitted during a handoff."
    );
    describe_counter!(TURNS, Unit::Count, "Turns, by outcome.");
    describe_histogram!(TURN_DURATION, Unit::Seconds, "How long turns ran.");
    describe_histogram!(TURN_ROUNDS, Unit::Count, "Rounds per turn.");
    describe_counter!(
        TOOL_CALLS,
        Unit::Count,
        "Tool calls the engine executed for turns."
    );
    describe_counter!(
        TOKENS,
        Unit::Count,
        "Tokens the model agents' completions spent."
    );
    describe_counter!(
        TRIGGERS_SKIPPED,
        Unit::Count,
        "Triggers that will not run (again), by reason."
    );
    describe_counter!(DELIVERIES, Unit::Count, "Deliveries, by disposition.");
    describe_gauge!(DEAD_LETTERS, Unit::Count, "Dead letters kept.");
    describe_counter!(
        HTTP_REQUESTS,
        Unit::Count,
        "HTTP requests, by route and status."
    );
    describe_histogram!(
        HTTP_DURATION,
        Unit::Seconds,
        "How long HTTP requests took, by route."
    );
    describe_counter!(SIGN_INS, Unit::Count, "Sign-in attempts, by outcome.");
    describe_gauge!(EVENT_STREAMS, Unit::Count, "Event streams open now.");
    describe_counter!(
        TOOL_SERVER_FAILURES,
        Unit::Count,
        "Tool servers that failed to start or exited."
    );
}
