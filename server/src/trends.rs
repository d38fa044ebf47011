//! The node's own last hour, minute by minute, for the dashboard's charts
//! (no external service): the seats it held, the turns it finished and its
//! coordination store's p99 in each minute, and the inbox depth of every
//! seat it held, sampled on the sweep's cadence.
//!
//! It owns those samples (in memory: an hour of them, lost with the
//! process) and the answers to `crewlet.trends.{incarnation}`, where a
//! peer asks for them over the fleet's request/reply transport. Settings ›
//! Nodes gathers a strip from every live node ([`Trends::fleet`]); a seat's
//! page asks the seat's holder for its inbox ([`Trends::seat_inbox`]).
//! Rolling minutes and filling an hour are pure ([`Window`], [`fill`]).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use app::api::{FleetTrends, InboxMinute, NodeMinute, NodeTrend};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::coord::Store;
use crate::metrics::{self as m, Update};
use crate::scatter::{Scatter, ScatterError};
use crate::tasks::Tasks;

/// Minutes kept: an hour.
pub const MINUTES_KEPT: usize = 60;
/// Store latencies one minute keeps for its p99.
const LATENCIES_PER_MINUTE: usize = 8_192;

/// `crewlet.trends.{incarnation}`: where an incarnation answers for its
/// last hour.
pub fn trends_subject(incarnation: &str) -> String {
    format!("crewlet.trends.{incarnation}")
}

/// A request (JSON): `{"want": "node"}` or `{"want": "inbox", "seat": "a"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "want", rename_all = "snake_case")]
enum Want {
    Node,
    Inbox { seat: String },
}

/// Its answer (JSON).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct Reply {
    node_id: String,
    #[serde(default)]
    minutes: Vec<NodeMinute>,
    #[serde(default)]
    inbox: Vec<InboxMinute>,
    /// Whether the node holds the seat asked about.
    #[serde(default)]
    holds: bool,
    #[serde(default)]
    error: Option<String>,
}

/// The samples of the minutes kept: pure, so rolling a minute over and
/// what each minute keeps are tested as values.
#[derive(Debug, Default)]
pub struct Window {
    /// The minute being sampled, and what it has so far.
    current: Option<Open>,
    closed: VecDeque<NodeMinute>,
    /// Per seat: the deepest inbox seen each minute, oldest first.
    inbox: BTreeMap<String, VecDeque<InboxMinute>>,
}

#[derive(Debug, Default)]
struct Open {
    minute: String,
    seats_held: Option<u64>,
    turns: u64,
    latencies: Vec<f64>,
}

impl Open {
    fn close(self) -> NodeMinute {
        NodeMinute {
            minute: self.minute,
            seats_held: self.seats_held,
            turns: self.turns,
            store_p99_us: crate::metrics::p99(&self.latencies).map(|s| (s * 1e6).round() as u64),
        }
    }
}

impl Window {
    /// The open minute, `minute`: the one before it is closed when the
    /// minute turned.
    fn at(&mut self, minute: &str) -> &mut Open {
        if self.current.as_ref().is_some_and(|c| c.minute != minute) {
            let done = self.current.take().map(Open::close);
            self.closed.extend(done);
            while self.closed.len() > MINUTES_KEPT {
                self.closed.pop_front();
            }
        }
        self.current.get_or_insert_with(|| Open {
            minute: minute.to_string(),
            ..Open::default()
        })
    }

    /// A sample at `minute`: seats held, store latencies (seconds) since
    /// the last sample, and the inbox depth of each seat held.
    pub fn sample(
        &mut self,
        minute: &str,
        seats_held: u64,
        latencies: &[f64],
        depths: &[(String, u64)],
    ) {
        let open = self.at(minute);
        open.seats_held = Some(seats_held);
        let room = LATENCIES_PER_MINUTE.saturating_sub(open.latencies.len());
        open.latencies.extend(latencies.iter().take(room));
        for (seat, depth) in depths {
            let kept = self.inbox.entry(seat.clone()).or_default();
            match kept.back_mut() {
                Some(last) if last.minute == minute => {
                    last.depth = Some(last.depth.unwrap_or(0).max(*depth));
                    last.latest = Some(*depth);
                }
                _ => kept.push_back(InboxMinute {
                    minute: minute.to_string(),
                    depth: Some(*depth),
                    latest: Some(*depth),
                }),
            }
            while kept.len() > MINUTES_KEPT {
                kept.pop_front();
            }
        }
        // A seat not sampled for an hour is forgotten.
        self.inbox.retain(|_, k| {
            k.back()
                .is_some_and(|m| minutes_apart(&m.minute, minute) < MINUTES_KEPT as i64)
        });
    }

    /// One more finished turn at `minute`.
    pub fn turn(&mut self, minute: &str) {
        self.at(minute).turns += 1;
    }

    /// The minutes kept, the open one last (its p99 so far).
    pub fn minutes(&self) -> Vec<NodeMinute> {
        let mut out: Vec<NodeMinute> = self.closed.iter().cloned().collect();
        if let Some(c) = &self.current {
            out.push(NodeMinute {
                minute: c.minute.clone(),
                seats_held: c.seats_held,
                turns: c.turns,
                store_p99_us: crate::metrics::p99(&c.latencies).map(|s| (s * 1e6).round() as u64),
            });
        }
        out
    }

    /// The inbox minutes kept of `seat`.
    pub fn inbox(&self, seat: &str) -> Vec<InboxMinute> {
        self.inbox
            .get(seat)
            .map(|k| k.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// Pure: how many minutes `b` is after `a` (both `YYYY-MM-DDTHH:MM`); a
/// large number when either cannot be read.
fn minutes_apart(a: &str, b: &str) -> i64 {
    match (unix_minute(a), unix_minute(b)) {
        (Some(a), Some(b)) => b - a,
        _ => i64::MAX,
    }
}

/// Pure: `YYYY-MM-DDTHH:MM` as minutes since the Unix epoch.
fn unix_minute(m: &str) -> Option<i64> {
    let n = |r: std::ops::Range<usize>| m.get(r).and_then(|s| s.parse::<i64>().ok());
    let month = time::Month::try_from(u8::try_from(n(5..7)?).ok()?).ok()?;
    let date = time::Date::from_calendar_date(
        i32::try_from(n(0..4)?).ok()?,
        month,
        u8::try_from(n(8..10)?).ok()?,
    )
    .ok()?;
    let t = time::Time::from_hms(
        u8::try_from(n(11..13)?).ok()?,
        u8::try_from(n(14..16)?).ok()?,
        0,
    )
    .ok()?;
    Some(date.with_time(t).assume_utc().unix_timestamp() / 60)
}

/// Pure: one entry per minute of `hour` (oldest first) from `have`, the
/// minutes not in it empty.
pub fn fill<T: Clone>(
    hour: &[String],
    have: &[T],
    minute_of: impl Fn(&T) -> &str,
    empty: impl Fn(&str) -> T,
) -> Vec<T> {
    let by: BTreeMap<&str, &T> = have.iter().map(|t| (minute_of(t), t)).collect();
    hour.iter()
        .map(|m| {
            by.get(m.as_str())
                .map(|t| (*t).clone())
                .unwrap_or_else(|| empty(m))
        })
        .collect()
}

/// The hour ending at `now`: sixty `YYYY-MM-DDTHH:MM` minutes, oldest first.
pub fn hour_to(now: time::OffsetDateTime) -> Vec<String> {
    (0..MINUTES_KEPT as i64)
        .rev()
        .map(|ago| minute_of(now - time::Duration::minutes(ago)))
        .collect()
}

/// `t`'s minute, `YYYY-MM-DDTHH:MM` (UTC).
pub fn minute_of(t: time::OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute()
    )
}

/// The minute it is now.
pub fn this_minute() -> String {
    minute_of(time::OffsetDateTime::now_utc())
}

/// Pure: whether seat-labelled series are exported for a company of
/// `seats` seats under `metrics.seat_series_limit` (0: never).
pub fn seat_series(seats: usize, limit: u64) -> bool {
    limit > 0 && seats as u64 <= limit
}

/// Pure: what one inbox sample moves: the total over the seats held
/// (`depths`), and, with `per_seat`, each seat's own series — set to 0 for
/// the seats held at the last sample and not now (`gone`), whose depth
/// their new holder reports.
pub fn inbox_updates(depths: &[(String, u64)], per_seat: bool, gone: &[String]) -> Vec<Update> {
    let mut out = vec![Update::Set {
        name: m::INBOX_DEPTH,
        value: depths.iter().map(|(_, d)| *d as f64).sum(),
    }];
    if per_seat {
        let seat = |h: &str, v: f64| Update::SetLabelled {
            name: m::SEAT_INBOX_DEPTH,
            labels: vec![("seat", h.to_string())],
            value: v,
        };
        out.extend(depths.iter().map(|(h, d)| seat(h, *d as f64)));
        out.extend(gone.iter().map(|h| seat(h, 0.0)));
    }
    out
}

/// The inbox depth of each held seat (`known`: each with what its
/// dispatch loop knows, [`crate::seat::host::SeatHost::inbox_depths`]), the
/// broker asked (`ask`, eight at a time) only for the seats whose loop does
/// not know — one whose turn is running, paused or just claimed. An idle
/// node asks nothing: cost that follows work, not seats × sweeps. A seat
/// the broker gave no answer for is left out of this sample.
pub async fn inbox_depths<F, Fut>(known: Vec<(String, Option<u64>)>, ask: F) -> Vec<(String, u64)>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Option<u64>>,
{
    use futures::StreamExt;
    let (depths, unknown): (Vec<_>, Vec<_>) = known.into_iter().partition(|(_, d)| d.is_some());
    let asked: Vec<(String, u64)> = futures::stream::iter(unknown)
        .map(|(h, _)| {
            let answer = ask(h.clone());
            async move { answer.await.map(|d| (h, d)) }
        })
        .buffer_unordered(8)
        .filter_map(std::future::ready)
        .collect()
        .await;
    let mut out: Vec<(String, u64)> = depths
        .into_iter()
        .filter_map(|(h, d)| d.map(|d| (h, d)))
        .collect();
    out.extend(asked);
    out
}

fn empty_node_minute(m: &str) -> NodeMinute {
    NodeMinute {
        minute: m.to_string(),
        ..NodeMinute::default()
    }
}

fn empty_inbox_minute(m: &str) -> InboxMinute {
    InboxMinute {
        minute: m.to_string(),
        depth: None,
        latest: None,
    }
}

/// Why a trend read failed.
#[derive(Debug, thiserror::Error)]
pub enum TrendsError {
    #[error("cannot listen for trend reads on {subject}: {source}")]
    Listen {
        subject: String,
        source: ScatterError,
    },
}

/// This node's last hour, and its peers' as it asks them.
pub struct Trends {
    node_id: String,
    incarnation: String,
    store: Arc<dyn Store>,
    scatter: Arc<dyn Scatter>,
    budget: Duration,
    window: Mutex<Window>,
}

impl Trends {
    pub fn new(
        node_id: String,
        incarnation: String,
        store: Arc<dyn Store>,
        scatter: Arc<dyn Scatter>,
        budget: Duration,
    ) -> Trends {
        Trends {
            node_id,
            incarnation,
            store,
            scatter,
            budget,
            window: Mutex::new(Window::default()),
        }
    }

    fn window(&self) -> MutexGuard<'_, Window> {
        self.window.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A sample, now (see [`Window::sample`]).
    pub fn sample(&self, seats_held: u64, latencies: &[f64], depths: &[(String, u64)]) {
        self.window()
            .sample(&this_minute(), seats_held, latencies, depths);
    }

    /// A turn finished now.
    pub fn turn_finished(&self) {
        self.window().turn(&this_minute());
    }

    /// Answer trend reads on `crewlet.trends.{incarnation}` until `tasks`
    /// stops. Returns once the node is listening.
    pub async fn serve(self: &Arc<Self>, tasks: &Tasks) -> Result<(), TrendsError> {
        let subject = trends_subject(&self.incarnation);
        let me = self.clone();
        crate::scatter::respond(
            &*self.scatter,
            &subject,
            tasks,
            "trends-responder",
            4,
            move |payload| std::future::ready(me.answer(&payload)),
        )
        .await
        .map_err(|source| TrendsError::Listen { subject, source })
    }

    fn answer(&self, payload: &[u8]) -> Reply {
        let mut reply = Reply {
            node_id: self.node_id.clone(),
            ..Reply::default()
        };
        match serde_json::from_slice::<Want>(payload) {
            Err(e) => reply.error = Some(format!("not a trend read: {e}")),
            Ok(Want::Node) => reply.minutes = self.window().minutes(),
            Ok(Want::Inbox { seat }) => {
                reply.inbox = self.window().inbox(&seat);
                reply.holds = true;
            }
        }
        reply
    }

    /// Every live node's last hour (this one's first, then each peer that
    /// answers within the budget; one that does not says why).
    pub async fn fleet(&self) -> FleetTrends {
        let hour = hour_to(time::OffsetDateTime::now_utc());
        let mut out = FleetTrends {
            to: hour.last().cloned().unwrap_or_default(),
            ..FleetTrends::default()
        };
        out.nodes.push(NodeTrend {
            node_id: self.node_id.clone(),
            minutes: fill(
                &hour,
                &self.window().minutes(),
                |m| &m.minute,
                empty_node_minute,
            ),
            error: None,
        });
        let peers = match crate::scatter::peers(&*self.store, &self.incarnation).await {
            Ok(p) => p,
            Err(e) => {
                out.roster_error = Some(format!(
                    "the fleet's roster cannot be read ({e}), so no other node was asked."
                ));
                Vec::new()
            }
        };
        let request = Bytes::from(serde_json::to_vec(&Want::Node).unwrap_or_default());
        let asked =
            crate::scatter::ask_each(&*self.scatter, peers, trends_subject, request, self.budget)
                .await;
        let mut peers: Vec<NodeTrend> = asked
            .into_iter()
            .map(|(node_id, got)| {
                let (minutes, error) = match read_reply(got) {
                    Ok(r) => (r.minutes, None),
                    Err(why) => (Vec::new(), Some(why.to_string())),
                };
                NodeTrend {
                    node_id,
                    minutes: fill(&hour, &minutes, |m| &m.minute, empty_node_minute),
                    error,
                }
            })
            .collect();
        peers.sort_by(|a, b| a.node_id.cmp(&b.node_id));
        out.nodes.extend(peers);
        out
    }

    /// `seat`'s inbox depth over the hour `hour`, from the node that holds
    /// it now (`holder`: its incarnation; this node's own samples when it
    /// is this node). `Err`: why the holder's could not be had.
    pub async fn seat_inbox(
        &self,
        seat: &str,
        holder: &str,
        hour: &[String],
    ) -> Result<Vec<InboxMinute>, NoReply> {
        let kept = if holder == self.incarnation {
            self.window().inbox(seat)
        } else {
            let request = Bytes::from(
                serde_json::to_vec(&Want::Inbox {
                    seat: seat.to_string(),
                })
                .unwrap_or_default(),
            );
            let got = self
                .scatter
                .ask(&trends_subject(holder), request, self.budget)
                .await;
            read_reply(got)?.inbox
        };
        Ok(fill(hour, &kept, |m| &m.minute, empty_inbox_minute))
    }
}

/// Why a peer's trends are not had: each reads as a sentence about the
/// peer ("it …"), as the pages show it.
#[derive(Debug, thiserror::Error)]
pub enum NoReply {
    /// It did not answer (the scatter's words for its silence).
    #[error("{0}")]
    Silent(String),
    /// It answered that it could not read its own trends.
    #[error("{0}")]
    Refused(String),
    #[error("its answer cannot be read: {0}")]
    Unreadable(serde_json::Error),
}

/// Pure: a peer's answer, or why there is none.
fn read_reply(got: Result<Bytes, ScatterError>) -> Result<Reply, NoReply> {
    match got {
        Err(e) => Err(NoReply::Silent(crate::scatter::silence(&e))),
        Ok(body) => match serde_json::from_slice::<Reply>(&body) {
            Ok(Reply { error: Some(e), .. }) => Err(NoReply::Refused(e)),
            Ok(r) => Ok(r),
            Err(e) => Err(NoReply::Unreadable(e)),
        },
    }
}

#[cfg(test)]
mod tests {

    #[tokio::test]
    async fn an_idle_seat_s_depth_comes_from_its_loop_and_only_seats_whose_loop_does_not_know_are_asked()
     {
        let asked = Mutex::new(Vec::new());
        let known = vec![
            ("idle".to_string(), Some(0)),
            ("delayed".to_string(), Some(2)),
            ("working".to_string(), None),
            ("silent".to_string(), None),
        ];
        let mut depths = inbox_depths(known, |h| {
            asked.lock().unwrap().push(h.clone());
            async move { (h == "working").then_some(5) }
        })
        .await;
        depths.sort();
        let mut asked = asked.into_inner().unwrap();
        asked.sort();
        assert_eq!(
            asked,
            ["silent", "working"],
            "the idle loops are never asked"
        );
        assert_eq!(
            depths,
            [
                ("delayed".to_string(), 2),
                ("idle".to_string(), 0),
                ("working".to_string(), 5)
            ],
            "a seat the broker did not answer for is left out"
        );
    }
    use super::*;

    fn at(unix: i64) -> time::OffsetDateTime {
        time::OffsetDateTime::from_unix_timestamp(unix).unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
    }

    #[test]
    fn the_inbox_depth_is_a_total_and_per_seat_only_for_a_small_company() {
        let depths = vec![("a".to_string(), 3), ("b".to_string(), 4)];
        assert_eq!(
            inbox_updates(&depths, false, &["c".into()]),
            vec![Update::Set {
                name: m::INBOX_DEPTH,
                value: 7.0
            }]
        );
        let seat = |h: &str, v: f64| Update::SetLabelled {
            name: m::SEAT_INBOX_DEPTH,
            labels: vec![("seat", h.to_string())],
            value: v,
        };
        assert_eq!(
            inbox_updates(&depths, true, &["c".into()]),
            vec![
                Update::Set {
                    name: m::INBOX_DEPTH,
                    value: 7.0
                },
                seat("a", 3.0),
                seat("b", 4.0),
                seat("c", 0.0),
            ]
        );
        assert!(seat_series(200, 200));
        assert!(!seat_series(201, 200));
        assert!(!seat_series(1, 0));
    }

    #[test]
    fn minutes_apart_reads_the_minutes_and_an_unreadable_one_is_far() {
        assert_eq!(minutes_apart("2026-12-02T10:00", "2026-12-02T11:01"), 61);
        assert_eq!(minutes_apart("2026-12-31T23:59", "2027-01-01T00:00"), 1);
        assert_eq!(minutes_apart("garbage", "2026-12-02T10:00"), i64::MAX);
    }

    #[test]
    fn a_minute_keeps_the_most_seats_its_turns_and_its_store_p99_and_closes_when_the_minute_turns()
    {
        let mut w = Window::default();
        w.sample("2026-12-02T10:00", 3, &[0.001, 0.002], &[]);
        w.turn("2026-12-02T10:00");
        w.turn("2026-12-02T10:00");
        w.sample("2026-12-02T10:00", 5, &[0.010], &[]);
        w.sample("2026-12-02T10:00", 4, &[], &[]);
        w.sample("2026-12-02T10:01", 4, &[], &[]);
        assert_eq!(
            w.minutes(),
            vec![
                NodeMinute {
                    minute: "2026-12-02T10:00".into(),
                    seats_held: Some(4),
                    turns: 2,
                    store_p99_us: Some(10_000),
                },
                NodeMinute {
                    minute: "2026-12-02T10:01".into(),
                    seats_held: Some(4),
                    turns: 0,
                    store_p99_us: None,
                },
            ]
        );
    }

    #[test]
    fn an_hour_is_kept_and_no_more() {
        let mut w = Window::default();
        let start = at(1_796_205_600);
        for i in 0..(MINUTES_KEPT as i64 + 30) {
            w.sample(
                &minute_of(start + time::Duration::minutes(i)),
                1,
                &[],
                &[("a".into(), i as u64)],
            );
        }
        let kept = w.minutes();
        // Sixty closed minutes and the open one.
        assert_eq!(kept.len(), MINUTES_KEPT + 1);
        assert_eq!(
            kept.last().map(|m| m.minute.as_str()),
            Some("2026-12-02T11:29")
        );
        assert_eq!(w.inbox("a").len(), MINUTES_KEPT);
        assert_eq!(w.inbox("a").last().and_then(|m| m.depth), Some(89));
    }

    #[test]
    fn a_seats_inbox_keeps_the_deepest_of_each_minute_and_is_forgotten_after_an_hour_unsampled() {
        let mut w = Window::default();
        w.sample(
            "2026-12-02T10:00",
            1,
            &[],
            &[("a".into(), 2), ("b".into(), 1)],
        );
        w.sample("2026-12-02T10:00", 1, &[], &[("a".into(), 7)]);
        w.sample("2026-12-02T10:00", 1, &[], &[("a".into(), 3)]);
        w.sample("2026-12-02T10:02", 1, &[], &[("a".into(), 0)]);
        assert_eq!(
            w.inbox("a"),
            vec![
                InboxMinute {
                    minute: "2026-12-02T10:00".into(),
                    depth: Some(7),
                    latest: Some(3),
                },
                InboxMinute {
                    minute: "2026-12-02T10:02".into(),
                    depth: Some(0),
                    latest: Some(0),
                },
            ]
        );
        w.sample("2026-12-02T11:00", 1, &[], &[("a".into(), 0)]);
        assert!(w.inbox("b").is_empty());
        assert_eq!(w.inbox("a").len(), 3);
    }

    #[test]
    fn an_hour_has_sixty_minutes_oldest_first_and_unsampled_minutes_are_empty() {
        let hour = hour_to(at(1_796_207_445));
        assert_eq!(hour.len(), 60);
        assert_eq!(hour[0], "2026-12-02T09:31");
        assert_eq!(hour[59], "2026-12-02T10:30");
        let have = vec![InboxMinute {
            minute: "2026-12-02T10:29".into(),
            depth: Some(4),
            latest: Some(1),
        }];
        let filled = fill(&hour, &have, |m| &m.minute, empty_inbox_minute);
        assert_eq!(filled.len(), 60);
        assert_eq!(filled[58].depth, Some(4));
        assert_eq!(filled[59].depth, None);
        assert_eq!(filled[0].minute, "2026-12-02T09:31");
    }

    #[test]
    fn a_trend_read_round_trips_and_a_bad_one_is_refused_in_words() {
        let asked = serde_json::to_string(&Want::Inbox { seat: "a".into() }).unwrap_or_default();
        assert_eq!(asked, r#"{"want":"inbox","seat":"a"}"#);
        assert_eq!(
            serde_json::from_str::<Want>(r#"{"want":"node"}"#).ok(),
            Some(Want::Node)
        );
        let silent = read_reply(Err(ScatterError::TimedOut(Duration::from_secs(2)))).err();
        assert!(matches!(silent, Some(NoReply::Silent(_))), "{silent:?}");
        assert_eq!(
            silent.map(|e| e.to_string()).as_deref(),
            Some("it did not answer within 2s")
        );
        let garbled = read_reply(Ok(Bytes::from_static(b"nope"))).err();
        assert!(
            matches!(garbled, Some(NoReply::Unreadable(_))),
            "{garbled:?}"
        );
        assert!(garbled.is_some_and(|e| e.to_string().starts_with("its answer cannot be read")));
    }
}
