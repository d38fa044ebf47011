//! Live pages: the browser subscribes to the node's event stream
//! (`GET /api/events`, Server-Sent Events) while a page is open, and the
//! page refetches what it shows when an event that changes it arrives.
//! Nothing polls: between events nothing is asked of the node (the stream
//! itself carries a keep-alive comment).
//!
//! A page refetches at once on the first relevant event; the events that
//! arrive in the [`COALESCE_MS`] after it are one more refetch at the end of
//! that window, and so on while they keep coming. A lone event reaches the
//! page as fast as one refetch; a burst costs at most two.
//!
//! While the stream is not open the page shows a "reconnecting…" badge. The
//! browser reconnects by itself after a dropped connection (sending
//! `Last-Event-ID`); when it gives up (the node answered with an error, as
//! while it restarts or once the session ended) a new stream is opened
//! after a pause that grows from one second to thirty, asking for what came
//! after the last event received (`?last_event_id=`). After any reconnect,
//! and on a `resync` event, the page refetches, since events may have been
//! missed.

use leptos::prelude::*;

/// Every event name the node sends (docs/mail-and-turns.md § Events). A browser only
/// hears the named events it listens for, so the Events page listens for
/// each of these.
pub const EVENT_NAMES: &[&str] = &[
    "node_started",
    "node_draining",
    "node_stopped",
    "seat_sweep",
    "seat_claimed",
    "seat_attached",
    "seat_detached",
    "seats_unplaceable",
    "seat_claims_withheld",
    "seat_claims_blocked_by_older_protocol",
    "seat_admission_stale",
    "seat_renew_unknown",
    "seat_release_unproven",
    "seat_still_unproven",
    "seat_release_recovered",
    "seat_undead_lost",
    "seat_released_role_gone",
    "company_applied",
    "message_dead_lettered",
    "delivery_deferred",
    "message_recovered",
    "message_republished",
    "turn_started",
    "turn_completed",
    "turn_trigger_skipped",
    "turn.guard_breach",
    "turn_trigger_ignored",
    "seat_paused",
    "seat_resumed",
    "turn_stop_requested",
    "duty_released",
    "seat_mailbox_unregistered",
    "seat_mailbox_discovered",
    "seat_mailbox_returned",
    "seat_mailbox_absent",
    "seat_mailbox_retired",
    "seat_mailbox_retirement_held",
    "seat_mailbox_retirement_taken_over",
    "seat_mailbox_retirement_resumed",
    "mcp_server_started",
    "mcp_server_failed",
    "mcp_server_exited",
    "tool_approval_requested",
    "tool_approval_answered",
    "tool_approval_resumed",
    "seat_budget_exhausted",
    "seat_budget_restored",
    "run_started",
    "run_adopted",
    "run_resumed",
    "sandbox_run_failed",
    "schedule_fired",
    "seat_offered",
    "seat_offer_taken",
    "seat_offer_withdrawn",
    "seat_move_requested",
    "node_order_changed",
];

/// The event sent instead of a replay the node cannot give.
pub const RESYNC: &str = "resync";

/// Events that change what Settings › Nodes shows.
pub const NODE_EVENTS: &[&str] = &[
    "node_started",
    "node_draining",
    "node_stopped",
    "seat_claimed",
    "seat_attached",
    "seat_detached",
    "seat_release_unproven",
    "seat_still_unproven",
    "seat_release_recovered",
    "seat_undead_lost",
    "seat_released_role_gone",
    "seats_unplaceable",
    "seat_claims_blocked_by_older_protocol",
    "company_applied",
    "seat_offered",
    "seat_offer_taken",
    "seat_offer_withdrawn",
    "node_order_changed",
    "seat_move_requested",
];

/// The events of a handoff, which Settings › Nodes lists as they happen.
pub const HANDOFF_EVENTS: &[&str] = &["seat_offered", "seat_offer_taken", "seat_offer_withdrawn"];

/// Events that change what the Memory page shows.
pub const MEMORY_EVENTS: &[&str] = &[
    "node_stopped",
    "seat_claimed",
    "seat_attached",
    "seat_detached",
    "seat_release_unproven",
    "seat_release_recovered",
    "seat_undead_lost",
    "company_applied",
    "turn_completed",
];

/// Events that change what the Seats page shows.
pub const SEAT_EVENTS: &[&str] = &[
    "node_stopped",
    "seat_claimed",
    "seat_attached",
    "seat_detached",
    "seat_release_unproven",
    "seat_still_unproven",
    "seat_release_recovered",
    "seat_undead_lost",
    "seat_released_role_gone",
    "seat_paused",
    "seat_resumed",
    "company_applied",
    "turn_started",
    "turn_completed",
    "turn.guard_breach",
    "mcp_server_started",
    "mcp_server_failed",
    "mcp_server_exited",
    "tool_approval_requested",
    "tool_approval_answered",
    "tool_approval_resumed",
    "seat_budget_exhausted",
    "seat_budget_restored",
    "run_started",
    "run_adopted",
    "run_resumed",
    "sandbox_run_failed",
];

/// Events that follow a person's action (and so a new audit row).
pub const ACTION_EVENTS: &[&str] = &[
    "seat_paused",
    "seat_resumed",
    "turn_stop_requested",
    "company_applied",
    "node_order_changed",
    "seat_move_requested",
    "tool_approval_answered",
];

/// After a refetch, events within this window are one more refetch at its
/// end, so that a burst costs at most two.
pub const COALESCE_MS: u64 = 150;

/// The stream's state, as the badge shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Connection {
    /// Not open yet (the page has not hydrated, or the first connection is
    /// under way).
    Connecting,
    Open,
    /// It was open (or tried) and is not now.
    Reconnecting,
}

impl Connection {
    pub fn as_str(self) -> &'static str {
        match self {
            Connection::Connecting => "connecting",
            Connection::Open => "open",
            Connection::Reconnecting => "reconnecting",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Connection::Connecting => "connecting…",
            Connection::Open => "live",
            Connection::Reconnecting => "reconnecting…",
        }
    }
}

/// One event as the browser received it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveEvent {
    pub id: String,
    /// The event's name (`resync` for a resync).
    pub name: String,
    /// The event as JSON.
    pub data: String,
}

impl LiveEvent {
    /// The `seat` field of the event, if it has one.
    pub fn seat(&self) -> Option<String> {
        self.text("seat")
    }

    /// The `node` field of the event (the node it happened on).
    pub fn node(&self) -> Option<String> {
        self.text("node")
    }

    fn text(&self, key: &str) -> Option<String> {
        serde_json::from_str::<serde_json::Value>(&self.data)
            .ok()?
            .get(key)?
            .as_str()
            .map(str::to_string)
    }
}

/// Listen to the event stream while the calling component lives: `on_event`
/// gets every event named in `names` (and every `resync`), `on_reopen` runs
/// when the stream opens again after it was lost. Returns the stream's
/// state. Does nothing on the server.
pub fn use_event_stream(
    names: &'static [&'static str],
    on_event: impl Fn(LiveEvent) + 'static,
    on_reopen: impl Fn() + 'static,
) -> ReadSignal<Connection> {
    use_event_stream_after(names, || None, on_event, on_reopen)
}

/// [`use_event_stream`], the stream starting after the event id `after`
/// gives when it opens (a page that showed the kept events up to that id
/// gets every later one, nothing twice).
pub fn use_event_stream_after(
    names: &'static [&'static str],
    after: impl Fn() -> Option<u64> + 'static,
    on_event: impl Fn(LiveEvent) + 'static,
    on_reopen: impl Fn() + 'static,
) -> ReadSignal<Connection> {
    let (state, set_state) = signal(Connection::Connecting);
    #[cfg(feature = "hydrate")]
    {
        let mut start = Some((on_event, on_reopen, after));
        Effect::new(move |_| {
            if let Some((on_event, on_reopen, after)) = start.take() {
                let from = untrack(&after).map(|id| id.to_string());
                let shared = client::open(
                    names,
                    from,
                    Box::new(on_event),
                    Box::new(on_reopen),
                    set_state,
                );
                let shared = send_wrapper::SendWrapper::new(shared);
                on_cleanup(move || client::close(&shared));
            }
        });
    }
    #[cfg(not(feature = "hydrate"))]
    {
        let _ = (names, after, on_event, on_reopen, set_state);
    }
    state
}

/// Call `refetch` when an event named in `names` for which `relevant`
/// holds arrives, on a `resync`, and after a reconnect: at once, then at
/// most once more per [`COALESCE_MS`] while events keep coming. Returns the
/// stream's state.
pub fn refetch_on(
    names: &'static [&'static str],
    relevant: impl Fn(&LiveEvent) -> bool + 'static,
    refetch: impl Fn() + Clone + 'static,
) -> ReadSignal<Connection> {
    refetch_on_and(names, relevant, refetch, |_| {})
}

/// [`refetch_on`], on the same stream also handing every event named in
/// `names` (and every `resync`) to `each` as it arrives — for a page that
/// both refetches and keeps a list built from the events themselves.
pub fn refetch_on_and(
    names: &'static [&'static str],
    relevant: impl Fn(&LiveEvent) -> bool + 'static,
    refetch: impl Fn() + Clone + 'static,
    each: impl Fn(&LiveEvent) + 'static,
) -> ReadSignal<Connection> {
    #[cfg(feature = "hydrate")]
    {
        use std::cell::Cell;
        use std::rc::Rc;

        /// A refetch window: open while `busy`; `again` when an event came
        /// during it.
        #[derive(Default)]
        struct Window {
            busy: Cell<bool>,
            again: Cell<bool>,
        }

        fn close_later(w: Rc<Window>, refetch: Rc<dyn Fn()>) {
            set_timeout(
                move || {
                    if w.again.replace(false) {
                        refetch();
                        close_later(w, refetch);
                    } else {
                        w.busy.set(false);
                    }
                },
                std::time::Duration::from_millis(COALESCE_MS),
            );
        }

        let window = Rc::new(Window::default());
        let later: Rc<dyn Fn()> = Rc::new(refetch.clone());
        let on_event = move |e: LiveEvent| {
            each(&e);
            if e.name != RESYNC && !relevant(&e) {
                return;
            }
            if window.busy.replace(true) {
                window.again.set(true);
                return;
            }
            later();
            close_later(window.clone(), later.clone());
        };
        use_event_stream(names, on_event, refetch)
    }
    #[cfg(not(feature = "hydrate"))]
    {
        let _ = (relevant, refetch, each);
        use_event_stream(names, |_| {}, || {})
    }
}

/// The stream's state as a small badge ("live", "reconnecting…").
#[component]
pub fn LiveBadge(state: ReadSignal<Connection>) -> impl IntoView {
    view! {
        <span
            class=move || format!("live live-{}", state.get().as_str())
            role="status"
            aria-live="polite"
            title="The page follows the node's event stream"
        >
            {move || state.get().label()}
        </span>
    }
}

#[cfg(feature = "hydrate")]
mod client {
    //! The browser's `EventSource`, opened again when the browser gives up.

    use std::cell::{Cell, RefCell};
    use std::rc::{Rc, Weak};
    use std::time::Duration;

    use leptos::prelude::*;
    use wasm_bindgen::JsCast;
    use wasm_bindgen::closure::Closure;
    use web_sys::{EventSource, MessageEvent};

    use super::{Connection, LiveEvent, RESYNC};

    const FIRST_RETRY_MS: u64 = 1_000;
    const LAST_RETRY_MS: u64 = 30_000;

    pub struct Shared {
        names: &'static [&'static str],
        on_event: Box<dyn Fn(LiveEvent)>,
        on_reopen: Box<dyn Fn()>,
        state: WriteSignal<Connection>,
        alive: Cell<bool>,
        /// The stream was lost since it last opened.
        lost: Cell<bool>,
        retry_ms: Cell<u64>,
        current: RefCell<Option<Stream>>,
        /// The id of the last event received: a new stream asks for what
        /// came after it (`?last_event_id=`).
        last_id: RefCell<Option<String>>,
    }

    struct Stream {
        source: EventSource,
        _on_open: Closure<dyn FnMut(web_sys::Event)>,
        _on_error: Closure<dyn FnMut(web_sys::Event)>,
        _on_message: Closure<dyn FnMut(MessageEvent)>,
    }

    pub fn open(
        names: &'static [&'static str],
        after: Option<String>,
        on_event: Box<dyn Fn(LiveEvent)>,
        on_reopen: Box<dyn Fn()>,
        state: WriteSignal<Connection>,
    ) -> Rc<Shared> {
        let shared = Rc::new(Shared {
            names,
            on_event,
            on_reopen,
            state,
            alive: Cell::new(true),
            lost: Cell::new(false),
            retry_ms: Cell::new(FIRST_RETRY_MS),
            current: RefCell::new(None),
            last_id: RefCell::new(after),
        });
        connect(&shared);
        shared
    }

    pub fn close(shared: &Rc<Shared>) {
        shared.alive.set(false);
        if let Some(stream) = shared.current.borrow_mut().take() {
            stream.source.close();
            // Dropped once no handler of it can be running.
            set_timeout(move || drop(stream), Duration::ZERO);
        }
    }

    fn connect(shared: &Rc<Shared>) {
        if !shared.alive.get() {
            return;
        }
        let url = match shared.last_id.borrow().as_deref() {
            Some(id) => format!("/api/events?last_event_id={id}"),
            None => "/api/events".to_string(),
        };
        let source = match EventSource::new(&url) {
            Ok(s) => s,
            Err(_) => {
                shared.state.set(Connection::Reconnecting);
                retry_later(shared);
                return;
            }
        };
        let weak = Rc::downgrade(shared);
        let on_open = Closure::<dyn FnMut(web_sys::Event)>::new(move |_| {
            if let Some(s) = weak.upgrade() {
                s.retry_ms.set(FIRST_RETRY_MS);
                s.state.set(Connection::Open);
                if s.lost.replace(false) {
                    (s.on_reopen)();
                }
            }
        });
        let weak = Rc::downgrade(shared);
        let on_error = Closure::<dyn FnMut(web_sys::Event)>::new(move |_| {
            if let Some(s) = weak.upgrade() {
                s.lost.set(true);
                s.state.set(Connection::Reconnecting);
                let gave_up = s
                    .current
                    .borrow()
                    .as_ref()
                    .is_some_and(|c| c.source.ready_state() == EventSource::CLOSED);
                if gave_up {
                    retry_later(&s);
                }
            }
        });
        let weak: Weak<Shared> = Rc::downgrade(shared);
        let on_message = Closure::<dyn FnMut(MessageEvent)>::new(move |e: MessageEvent| {
            if let Some(s) = weak.upgrade() {
                let id = e.last_event_id();
                // Ids are numbers; anything else is not sent back.
                if !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()) {
                    *s.last_id.borrow_mut() = Some(id);
                }
                (s.on_event)(LiveEvent {
                    id: e.last_event_id(),
                    name: e.type_(),
                    data: e.data().as_string().unwrap_or_default(),
                });
            }
        });
        source.set_onopen(Some(on_open.as_ref().unchecked_ref()));
        source.set_onerror(Some(on_error.as_ref().unchecked_ref()));
        for name in shared.names.iter().copied().chain([RESYNC]) {
            let _ =
                source.add_event_listener_with_callback(name, on_message.as_ref().unchecked_ref());
        }
        *shared.current.borrow_mut() = Some(Stream {
            source,
            _on_open: on_open,
            _on_error: on_error,
            _on_message: on_message,
        });
    }

    /// The browser gave up on the stream: open a new one after a pause.
    fn retry_later(shared: &Rc<Shared>) {
        // The node refuses a stream to an ended session (401, which an
        // EventSource cannot see): ask once whether that is why.
        leptos::task::spawn_local(async {
            if let Err(crate::error::AppError::NotSignedIn) = crate::fns::whoami().await {
                crate::components::notice::session_ended();
            }
        });
        let delay = shared.retry_ms.get();
        shared.retry_ms.set((delay * 2).min(LAST_RETRY_MS));
        let weak = Rc::downgrade(shared);
        set_timeout(
            move || {
                if let Some(s) = weak.upgrade() {
                    // The old stream's handlers are not running now.
                    drop(s.current.borrow_mut().take());
                    connect(&s);
                }
            },
            Duration::from_millis(delay),
        );
    }
}
