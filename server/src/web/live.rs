//! `GET /api/events`: the node's event bus (on a fleet, every node's events)
//! as Server-Sent Events, for the dashboard's live pages and for people's
//! scripts.
//!
//! One task owned by the node's [`Tasks`] numbers every event it reads from
//! the bus and keeps the newest [`EVENT_LOG_CAPACITY`] in a ring
//! ([`EventLog`]). A client is sent, for each event, `event:` (the event's
//! name), `id:` (its number) and `data:` (the event as JSON, the same object
//! `crewlet.events.{node}` carries). A client that reconnects with
//! `Last-Event-ID` (or `?last_event_id=`, for a new stream) first gets
//! every event after that id from the ring; when
//! the ring cannot say what came after it (the id is older than the ring,
//! newer than anything this node numbered, or not a number), it gets one
//! `resync` event instead and goes on live. The stream ends when the node
//! shuts down, so open streams never hold up a graceful shutdown.
//!
//! The same task keeps, per seat, what the fleet's events say that a lease
//! cannot: a holder whose teardown is failing, and the last error that
//! broke one of its turns ([`SeatNotes`]).

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::extract::{Extension, Query};
use axum::http::HeaderMap;
use axum::response::sse::{self, KeepAlive, Sse};
use futures::Stream;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::events::{Event, EventBus, FleetEvent};
use crate::tasks::Tasks;

/// Events kept for clients that reconnect.
pub const EVENT_LOG_CAPACITY: usize = 2048;

/// How often an idle stream carries a comment, so proxies and browsers do
/// not time the connection out.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The name of the event sent when the events after a client's
/// `Last-Event-ID` cannot be replayed.
pub const RESYNC: &str = "resync";

/// Live events queued for one slow client before it is caught up from the
/// ring instead.
const CLIENT_QUEUE: usize = 1024;

/// One numbered event, encoded once for every client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Numbered {
    pub id: u64,
    pub name: String,
    /// The [`FleetEvent`] as JSON.
    pub data: Arc<str>,
}

/// What a client gets before the live events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Replay {
    /// The events after its id (none for a client that sent no id).
    Events(Vec<Numbered>),
    /// The events after its id cannot be told: `reason` says why. `id` is
    /// the newest id numbered so far, which the client resumes from.
    Resync { id: u64, reason: String },
}

struct Ring {
    events: VecDeque<Numbered>,
    capacity: usize,
    /// The id of the newest event (the base before the first).
    last: u64,
}

/// A client's start: its replay, the id it stands at after the replay,
/// and the events numbered from then on.
pub struct Subscription {
    pub replay: Replay,
    pub position: u64,
    pub rx: broadcast::Receiver<Numbered>,
}

/// The ring of recent events and the broadcast of each one as it is
/// numbered.
pub struct EventLog {
    ring: Mutex<Ring>,
    tx: broadcast::Sender<Numbered>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl EventLog {
    /// A log keeping `capacity` events whose first event is numbered
    /// `base + 1`.
    pub fn new(capacity: usize, base: u64) -> EventLog {
        let (tx, _) = broadcast::channel(CLIENT_QUEUE);
        EventLog {
            ring: Mutex::new(Ring {
                events: VecDeque::with_capacity(capacity.min(EVENT_LOG_CAPACITY)),
                capacity: capacity.max(1),
                last: base,
            }),
            tx,
        }
    }

    /// A log for this process: its ids start at the current time in
    /// microseconds, so they keep increasing across the node's restarts
    /// (while its clock does) and an id from an earlier run is older than
    /// anything kept.
    pub fn for_this_process() -> EventLog {
        let base = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        EventLog::new(EVENT_LOG_CAPACITY, base)
    }

    /// Number `name` / `data` as the next event, keep it, and send it to
    /// every client. Returns its id.
    pub fn push(&self, name: &str, data: &str) -> u64 {
        let mut ring = lock(&self.ring);
        ring.last += 1;
        let n = Numbered {
            id: ring.last,
            name: name.to_string(),
            data: Arc::from(data),
        };
        if ring.events.len() == ring.capacity {
            ring.events.pop_front();
        }
        ring.events.push_back(n.clone());
        // Sent under the lock, so a client subscribing sees every event
        // either in its replay or live, never in both or in neither.
        let _ = self.tx.send(n);
        ring.last
    }

    /// Number and keep one event of the fleet.
    pub fn record(&self, e: &FleetEvent) -> u64 {
        let data = serde_json::to_string(e).unwrap_or_default();
        self.push(&e.event.name(), &data)
    }

    /// Every event numbered from now on (for the kept history).
    pub fn listen(&self) -> broadcast::Receiver<Numbered> {
        self.tx.subscribe()
    }

    /// The newest id numbered so far.
    pub fn last_id(&self) -> u64 {
        lock(&self.ring).last
    }

    /// A new client: what it gets first, given the `Last-Event-ID` it sent
    /// (if any), and every event numbered from then on.
    pub fn subscribe(&self, last_event_id: Option<&str>) -> Subscription {
        let ring = lock(&self.ring);
        let rx = self.tx.subscribe();
        let replay = match last_event_id.map(str::trim) {
            None => Replay::Events(Vec::new()),
            Some(raw) => match raw.parse::<u64>() {
                Ok(id) => replay_after(&ring, id),
                Err(_) => Replay::Resync {
                    id: ring.last,
                    reason: format!(
                        "Last-Event-ID {raw:?} is not an event id of this node; read the current state again"
                    ),
                },
            },
        };
        Subscription {
            replay,
            position: ring.last,
            rx,
        }
    }

    /// Follow `bus` in a task owned by `tasks`: every event is numbered,
    /// kept and sent to the clients, and `notes` learns from it.
    pub fn follow(self: &Arc<Self>, bus: &EventBus, notes: Arc<SeatNotes>, tasks: &Tasks) {
        let mut rx = bus.subscribe();
        let log = self.clone();
        tasks.spawn("event-log", async move {
            loop {
                match rx.recv().await {
                    Ok(e) => {
                        notes.learn(&e);
                        log.record(&e);
                    }
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::warn!(
                            missed,
                            "the event log fell behind the event bus; clients miss those events"
                        );
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                }
            }
        });
    }
}

fn replay_after(ring: &Ring, id: u64) -> Replay {
    if id > ring.last {
        return Replay::Resync {
            id: ring.last,
            reason: format!(
                "event {id} is newer than this node's newest ({}); the node restarted or the id is not its own; read the current state again",
                ring.last
            ),
        };
    }
    // The oldest id a client may hold and still be told everything after it.
    let oldest = ring.events.front().map_or(ring.last, |e| e.id - 1);
    if id < oldest {
        return Replay::Resync {
            id: ring.last,
            reason: format!(
                "event {id} is older than the {} events this node keeps; read the current state again",
                ring.capacity
            ),
        };
    }
    Replay::Events(ring.events.iter().filter(|e| e.id > id).cloned().collect())
}

/// What the fleet's events say about seats held anywhere: whose teardown
/// is failing (undead) and the last error that broke a turn.
#[derive(Default)]
pub struct SeatNotes {
    seats: Mutex<HashMap<String, SeatNote>>,
}

/// One seat's notes, each tied to the node and epoch it was said of.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SeatNote {
    /// (node, epoch) of a tenure whose teardown is failing.
    pub unproven: Option<(String, u64)>,
    /// When that teardown started failing (Unix seconds, the reporting
    /// node's clock), when an event said.
    pub unproven_since: Option<i64>,
    /// (node, error) of the last turn that broke.
    pub last_error: Option<(String, String)>,
    /// (node, epoch, turn id) of the turn running now, from `turn_started`
    /// until its `turn_completed`.
    pub running_turn: Option<(String, u64, String)>,
}

/// Unix seconds of an RFC 3339 timestamp.
fn unix_seconds(at: &str) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(at)
        .ok()
        .map(|t| t.timestamp())
}

impl SeatNotes {
    pub fn learn(&self, e: &FleetEvent) {
        let mut seats = lock(&self.seats);
        match &e.event {
            Event::SeatReleaseUnproven { seat, epoch, .. } => {
                let note = seats.entry(seat.clone()).or_default();
                let tenure = Some((e.node.clone(), *epoch));
                if note.unproven != tenure || note.unproven_since.is_none() {
                    note.unproven_since = unix_seconds(&e.at);
                }
                note.unproven = tenure;
            }
            Event::SeatStillUnproven {
                seat,
                epoch,
                elapsed_seconds,
                ..
            } => {
                let note = seats.entry(seat.clone()).or_default();
                let tenure = Some((e.node.clone(), *epoch));
                if note.unproven != tenure || note.unproven_since.is_none() {
                    note.unproven_since = unix_seconds(&e.at).map(|t| t - *elapsed_seconds as i64);
                }
                note.unproven = tenure;
            }
            Event::SeatReleaseRecovered { seat, .. } | Event::SeatUndeadLost { seat, .. } => {
                if let Some(n) = seats.get_mut(seat) {
                    n.unproven = None;
                    n.unproven_since = None;
                }
            }
            Event::SeatClaimed { seat, .. } => {
                // A new tenure: what was said of the last one is over.
                seats.remove(seat);
            }
            Event::TurnGuardBreach { seat, error, .. } => {
                seats.entry(seat.clone()).or_default().last_error =
                    Some((e.node.clone(), error.clone()));
            }
            Event::TurnStarted {
                seat,
                turn_id,
                epoch,
                ..
            } => {
                seats.entry(seat.clone()).or_default().running_turn =
                    Some((e.node.clone(), *epoch, turn_id.clone()));
            }
            Event::TurnCompleted { seat, turn_id, .. } => {
                if let Some(n) = seats.get_mut(seat)
                    && n.running_turn
                        .as_ref()
                        .is_some_and(|(_, _, t)| t == turn_id)
                {
                    n.running_turn = None;
                }
            }
            _ => {}
        }
    }

    /// Every seat's notes.
    pub fn snapshot(&self) -> HashMap<String, SeatNote> {
        lock(&self.seats).clone()
    }
}

/// What the `/api/events` handler needs.
#[derive(Clone)]
pub struct EventStreams {
    pub log: Arc<EventLog>,
    /// The node's shutdown: every stream ends when it fires.
    pub stop: CancellationToken,
    /// Sign-outs and removed people: their streams end when they happen.
    pub ends: tokio::sync::broadcast::Sender<crate::web::auth::SessionEnd>,
}

/// One frame of a client's stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    Event(Numbered),
    Resync { id: u64, reason: String },
}

impl Frame {
    pub fn id(&self) -> u64 {
        match self {
            Frame::Event(n) => n.id,
            Frame::Resync { id, .. } => *id,
        }
    }

    fn into_sse(self) -> sse::Event {
        match self {
            Frame::Event(n) => sse::Event::default()
                .event(&n.name)
                .id(n.id.to_string())
                .data(&*n.data),
            Frame::Resync { id, reason } => sse::Event::default()
                .event(RESYNC)
                .id(id.to_string())
                .data(serde_json::json!({ "reason": reason }).to_string()),
        }
    }
}

struct Client {
    log: Arc<EventLog>,
    queued: VecDeque<Frame>,
    rx: broadcast::Receiver<Numbered>,
    /// Every event up to this id has been queued or sent.
    last: u64,
    stop: CancellationToken,
}

impl Client {
    fn queue(&mut self, replay: Replay) {
        match replay {
            Replay::Events(events) => self.queued.extend(events.into_iter().map(Frame::Event)),
            Replay::Resync { id, reason } => self.queued.push_back(Frame::Resync { id, reason }),
        }
    }
}

/// The frames one client reads: its replay, then live events, until the
/// node shuts down.
pub fn frames(
    streams: &EventStreams,
    last_event_id: Option<&str>,
) -> impl Stream<Item = Frame> + Send + use<> {
    let Subscription {
        replay,
        position,
        rx,
    } = streams.log.subscribe(last_event_id);
    let mut client = Client {
        log: streams.log.clone(),
        queued: VecDeque::new(),
        rx,
        last: position,
        stop: streams.stop.clone(),
    };
    client.queue(replay);
    futures::stream::unfold(client, |mut c| async move {
        loop {
            if c.stop.is_cancelled() {
                return None;
            }
            if let Some(f) = c.queued.pop_front() {
                return Some((f, c));
            }
            let next = tokio::select! {
                biased;
                _ = c.stop.cancelled() => return None,
                r = c.rx.recv() => r,
            };
            match next {
                Ok(n) if n.id <= c.last => continue,
                Ok(n) => {
                    c.last = n.id;
                    return Some((Frame::Event(n), c));
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    // Too slow for the live queue: catch up from the ring
                    // (or be told to read the state again).
                    let last = c.last.to_string();
                    let s = c.log.subscribe(Some(&last));
                    c.rx = s.rx;
                    c.last = s.position;
                    c.queue(s.replay);
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
}

/// The query of `GET /api/events`.
#[derive(Debug, Default, serde::Deserialize)]
pub struct EventsQuery {
    /// The same as the `Last-Event-ID` header, for a client that opens a
    /// new stream (a browser's `EventSource` sends the header only when it
    /// reconnects by itself). The header wins when both are sent.
    pub last_event_id: Option<String>,
}

/// `GET /api/events`. The stream ends when its session signs out or its
/// person is removed (and when the node stops).
pub async fn events(
    Extension(streams): Extension<EventStreams>,
    Extension(person): Extension<app::api::Person>,
    session: tower_sessions::Session,
    headers: HeaderMap,
    Query(query): Query<EventsQuery>,
) -> Sse<impl Stream<Item = Result<sse::Event, Infallible>>> {
    use futures::StreamExt;
    let last = headers
        .get("last-event-id")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .or(query.last_event_id);
    let session_id = (!person.via_token)
        .then(|| session.id().map(|id| id.to_string()))
        .flatten();
    let mut ends = streams.ends.subscribe();
    let ended = async move {
        loop {
            match ends.recv().await {
                Ok(end) if end.ends(session_id.as_deref(), &person.name) => return,
                Ok(_) => {}
                // Missed some: end the stream, the client reconnects through
                // the sign-in gate, which decides afresh.
                Err(_) => return,
            }
        }
    };
    let open = OpenStream::counted();
    Sse::new(
        frames(&streams, last.as_deref())
            .take_until(ended)
            .map(move |f| {
                let _counted = &open;
                Ok(f.into_sse())
            }),
    )
    .keep_alive(KeepAlive::new().interval(KEEP_ALIVE).text("keep-alive"))
}

/// One open event stream, counted in `crewlet_event_streams` while it
/// lives.
struct OpenStream;

impl OpenStream {
    fn counted() -> OpenStream {
        metrics::gauge!(crate::metrics::EVENT_STREAMS).increment(1.0);
        OpenStream
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        metrics::gauge!(crate::metrics::EVENT_STREAMS).decrement(1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(r: &Replay) -> Vec<u64> {
        match r {
            Replay::Events(v) => v.iter().map(|e| e.id).collect(),
            Replay::Resync { .. } => panic!("expected events, got {r:?}"),
        }
    }

    fn is_resync(r: &Replay) -> bool {
        matches!(r, Replay::Resync { .. })
    }

    #[test]
    fn ids_start_after_the_base_and_increase_by_one() {
        let log = EventLog::new(4, 100);
        assert_eq!(log.last_id(), 100);
        assert_eq!(log.push("a", "{}"), 101);
        assert_eq!(log.push("b", "{}"), 102);
        assert_eq!(log.last_id(), 102);
    }

    #[test]
    fn a_client_without_an_id_gets_no_replay() {
        let log = EventLog::new(4, 0);
        log.push("a", "{}");
        let replay = log.subscribe(None);
        assert_eq!(replay.replay, Replay::Events(Vec::new()));
    }

    #[test]
    fn a_client_with_an_id_gets_every_event_after_it() {
        let log = EventLog::new(4, 0);
        for n in ["a", "b", "c"] {
            log.push(n, "{}");
        }
        assert_eq!(ids(&log.subscribe(Some("1")).replay), vec![2, 3]);
        assert_eq!(ids(&log.subscribe(Some("0")).replay), vec![1, 2, 3]);
        assert_eq!(ids(&log.subscribe(Some("3")).replay), Vec::<u64>::new());
        assert_eq!(ids(&log.subscribe(Some(" 2 ")).replay), vec![3]);
    }

    #[test]
    fn an_id_older_than_the_ring_gets_a_resync_at_the_newest_id() {
        let log = EventLog::new(4, 0);
        for _ in 0..6 {
            log.push("e", "{}");
        }
        // Kept: 3, 4, 5, 6. A client that saw 2 misses nothing.
        assert_eq!(ids(&log.subscribe(Some("2")).replay), vec![3, 4, 5, 6]);
        for old in ["1", "0"] {
            match log.subscribe(Some(old)).replay {
                Replay::Resync { id, reason } => {
                    assert_eq!(id, 6);
                    assert!(reason.contains("older than the 4 events"), "{reason}");
                }
                r => panic!("expected a resync for {old}, got {r:?}"),
            }
        }
    }

    #[test]
    fn an_id_from_the_future_or_not_a_number_gets_a_resync() {
        let log = EventLog::new(4, 10);
        log.push("e", "{}");
        for id in ["12", "18446744073709551615", "abc", "", "-1", "1.5"] {
            assert!(is_resync(&log.subscribe(Some(id)).replay), "{id:?}");
        }
        // An empty log with a client at its base misses nothing.
        let empty = EventLog::new(4, 10);
        assert_eq!(ids(&empty.subscribe(Some("10")).replay), Vec::<u64>::new());
        assert!(is_resync(&empty.subscribe(Some("9")).replay));
    }

    #[tokio::test]
    async fn replay_then_live_has_no_gap_and_no_repeat_and_shutdown_ends_it() {
        use futures::StreamExt;
        let log = Arc::new(EventLog::new(8, 0));
        log.push("a", "{}");
        log.push("b", "{}");
        let streams = EventStreams {
            ends: tokio::sync::broadcast::channel(4).0,
            log: log.clone(),
            stop: CancellationToken::new(),
        };
        let mut stream = Box::pin(frames(&streams, Some("1")));
        log.push("c", "{}");
        let mut got = Vec::new();
        for _ in 0..2 {
            got.push(stream.next().await.unwrap().id());
        }
        // b replayed, then c live.
        assert_eq!(got, vec![2, 3]);
        streams.stop.cancel();
        log.push("d", "{}");
        assert_eq!(stream.next().await, None, "shutdown ends the stream");
    }

    #[tokio::test]
    async fn a_client_too_slow_for_the_live_queue_catches_up_from_the_ring() {
        use futures::StreamExt;
        let log = Arc::new(EventLog::new(CLIENT_QUEUE * 2, 0));
        let streams = EventStreams {
            ends: tokio::sync::broadcast::channel(4).0,
            log: log.clone(),
            stop: CancellationToken::new(),
        };
        let mut stream = Box::pin(frames(&streams, None));
        let n = CLIENT_QUEUE as u64 + 10;
        for _ in 0..n {
            log.push("e", "{}");
        }
        for want in 1..=n {
            assert_eq!(
                stream.next().await.unwrap(),
                Frame::Event(Numbered {
                    id: want,
                    name: "e".into(),
                    data: Arc::from("{}"),
                })
            );
        }
        // Lagged further than the ring keeps: one resync, then live.
        let small = Arc::new(EventLog::new(4, 0));
        let streams = EventStreams {
            ends: tokio::sync::broadcast::channel(4).0,
            log: small.clone(),
            stop: CancellationToken::new(),
        };
        let mut stream = Box::pin(frames(&streams, None));
        for _ in 0..CLIENT_QUEUE + 10 {
            small.push("e", "{}");
        }
        match stream.next().await.unwrap() {
            Frame::Resync { id, .. } => assert_eq!(id, small.last_id()),
            f => panic!("expected a resync, got {f:?}"),
        }
        let next = small.push("e", "{}");
        assert_eq!(stream.next().await.unwrap().id(), next);
    }

    /// Every name the `Event` enum can take, from serde's own list (its
    /// answer to a name it does not know).
    fn every_event_name() -> Vec<String> {
        let err = serde_json::from_str::<Event>(r#"{"event":"no such event"}"#)
            .unwrap_err()
            .to_string();
        let list = err
            .split_once("expected one of ")
            .map(|(_, l)| l)
            .unwrap_or_else(|| panic!("serde's answer changed: {err}"));
        list.split(", ")
            .map(|n| {
                n.trim_start_matches('`')
                    .split('`')
                    .next()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect()
    }

    #[test]
    fn the_dashboard_listens_for_every_event_name() {
        let names = every_event_name();
        assert!(names.len() > 20, "{names:?}");
        let mut missing: Vec<&String> = names
            .iter()
            .filter(|n| !app::live::EVENT_NAMES.contains(&n.as_str()))
            .collect();
        missing.sort();
        assert!(
            missing.is_empty(),
            "add these to app::live::EVENT_NAMES (and docs/mail-and-turns.md § Events), or the Events page never hears them: {missing:?}"
        );
        for n in app::live::EVENT_NAMES {
            assert!(names.iter().any(|m| m == n), "{n} is not an event name");
        }
        assert!(!names.iter().any(|n| n == RESYNC));
    }

    #[test]
    fn a_seats_running_turn_is_noted_from_its_start_until_it_completes() {
        let notes = SeatNotes::default();
        let at = |event: Event| FleetEvent {
            node: "n2".into(),
            incarnation: "n2:1".into(),
            at: "2026-11-30T08:00:00Z".into(),
            event,
        };
        let completed = |turn_id: &str| {
            at(Event::TurnCompleted {
                seat: "a".into(),
                turn_id: turn_id.into(),
                work_key: None,
                epoch: 4,
                outcome: "stopped".into(),
                rounds: 1,
                calls: 0,
                reached_outside: false,
                recorded: true,
                disposition: "ack".into(),
                delivered: 1,
                error: None,
                tokens: None,
                retry_after_ms: None,
                duration_ms: 12,
            })
        };
        notes.learn(&at(Event::TurnStarted {
            seat: "a".into(),
            turn_id: "t2".into(),
            work_key: None,
            epoch: 4,
            trigger_ids: vec!["e1".into()],
            delivered: 1,
            waited_ms: 0,
        }));
        assert_eq!(
            notes.snapshot()["a"].running_turn,
            Some(("n2".into(), 4, "t2".into()))
        );
        // An earlier turn's completion heard late ends nothing.
        notes.learn(&completed("t1"));
        assert!(notes.snapshot()["a"].running_turn.is_some());
        notes.learn(&completed("t2"));
        assert_eq!(notes.snapshot()["a"].running_turn, None);
    }

    #[test]
    fn seat_notes_follow_the_fleets_events() {
        let notes = SeatNotes::default();
        let at = |node: &str, event: Event| FleetEvent {
            node: node.into(),
            incarnation: format!("{node}:1"),
            at: "2026-11-30T08:00:00Z".into(),
            event,
        };
        notes.learn(&at(
            "n1",
            Event::SeatReleaseUnproven {
                seat: "a".into(),
                epoch: 3,
                error: "stuck".into(),
            },
        ));
        notes.learn(&at(
            "n1",
            Event::TurnGuardBreach {
                seat: "a".into(),
                turn_id: "t".into(),
                kind: "unhandled_exception".into(),
                error: "boom".into(),
            },
        ));
        let a = notes.snapshot()["a"].clone();
        assert_eq!(a.unproven, Some(("n1".into(), 3)));
        assert_eq!(a.unproven_since, unix_seconds("2026-11-30T08:00:00Z"));
        assert_eq!(a.last_error, Some(("n1".into(), "boom".into())));
        notes.learn(&at(
            "n1",
            Event::SeatReleaseRecovered {
                seat: "a".into(),
                epoch: 3,
                attempts: 2,
            },
        ));
        assert_eq!(notes.snapshot()["a"].unproven, None);
        // Heard of first in a reminder: it started failing that long ago.
        notes.learn(&FleetEvent {
            at: "2026-11-30T08:10:00Z".into(),
            ..at(
                "n1",
                Event::SeatStillUnproven {
                    seat: "a".into(),
                    epoch: 3,
                    elapsed_seconds: 90,
                    attempts: 4,
                    error: "stuck".into(),
                },
            )
        });
        assert_eq!(
            notes.snapshot()["a"].unproven_since,
            unix_seconds("2026-11-30T08:08:30Z")
        );
        notes.learn(&at(
            "n2",
            Event::SeatClaimed {
                seat: "a".into(),
                epoch: 4,
                claim_ms: 0,
            },
        ));
        assert!(!notes.snapshot().contains_key("a"));
    }
}
