//! Seats: every seat of the active company revision — holder, state,
//! pause, inbox depth and last turn error — searched, filtered and paged by
//! the node, with Pause / Resume / Stop turn for operators (each confirmed
//! in a dialog naming the seat and its holder) and Move… (a dialog picking
//! a live node and asking why; a refusal is shown in it, as the node words
//! it), refreshed live from the event stream.

use leptos::prelude::*;
use leptos_router::components::Form;
use leptos_router::hooks::use_query_map;

use crate::api::{
    ApprovalView, FleetView, MoveRequestView, SeatActionResult, SeatList, SeatRow, SeatState,
};
use crate::components::notice::ErrorNotice;
use crate::components::pager::Pager;
use crate::error::AppError;
use crate::fns::{
    answer_approval, fleet, list_seats, move_seat, pause_seat, resume_seat, stop_seat_turn, whoami,
};
use crate::live::{Connection, LiveBadge, SEAT_EVENTS, refetch_on};
use crate::view::{runs_summary, spend_summary, tool_servers_summary};

mod dialogs;
mod row;
use dialogs::{ConfirmDialog, MoveDialog, Moving};
use row::SeatRowView;

/// What a person asks of a seat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ask {
    Pause,
    Resume,
    Stop,
}

impl Ask {
    fn button(self) -> &'static str {
        match self {
            Ask::Pause => "Pause",
            Ask::Resume => "Resume",
            Ask::Stop => "Stop turn",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Ask::Pause => "pause",
            Ask::Resume => "resume",
            Ask::Stop => "stop",
        }
    }
}

/// The seat a confirmation is about.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Confirm {
    ask: Ask,
    handle: String,
    holder: Option<String>,
}

/// A confirmed request.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Request {
    ask: Ask,
    handle: String,
    reason: String,
    stop_running_turn: bool,
}

/// The seat a move dialog is about.
#[derive(Clone, Debug, PartialEq, Eq)]
struct MoveAsk {
    handle: String,
    holder: Option<String>,
}

/// A move as submitted.
#[derive(Clone, Debug, PartialEq, Eq)]
struct MoveRequest {
    handle: String,
    node: String,
    reason: String,
}

async fn run(r: Request) -> Result<SeatActionResult, AppError> {
    let reason = Some(r.reason.trim().to_string()).filter(|s| !s.is_empty());
    match r.ask {
        Ask::Pause => pause_seat(r.handle, reason, r.stop_running_turn).await,
        Ask::Resume => resume_seat(r.handle).await,
        Ask::Stop => stop_seat_turn(r.handle, reason).await,
    }
}

fn seats_href(query: &str, state: &str, page: u32) -> String {
    super::page_href("/seats", &[("q", query), ("state", state)], page)
}

/// The seats as listed now.
type Listed = Resource<Result<SeatList, AppError>>;

/// An operator's pause, resume or stop, once confirmed.
type SeatAct = Action<Request, Result<SeatActionResult, AppError>>;

/// An operator's answer to an approval.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Answer {
    handle: String,
    approval_id: String,
    approve: bool,
    reason: String,
}

/// The answers given on this page.
type Answering = Action<Answer, Result<ApprovalView, AppError>>;

/// What a page with seat rows acts with: who may act, the pause / resume
/// / stop and approval answers (each reading `list` again once answered),
/// and the confirm and move dialogs.
#[derive(Clone, Copy)]
struct SeatActions {
    operator: Signal<bool>,
    act: SeatAct,
    answer: Answering,
    confirming: Confirming,
    moving: Moving,
    ask: Callback<Confirm>,
    ask_move: Callback<MoveAsk>,
}

impl SeatActions {
    fn new(list: Listed) -> SeatActions {
        let me = Resource::new(|| (), |_| whoami());
        let operator = Signal::derive(move || {
            me.get()
                .and_then(|r| r.ok())
                .is_some_and(|p| p.is_operator())
        });
        let act: SeatAct = Action::new(|r: &Request| run(r.clone()));
        let answer: Answering = Action::new(|a: &Answer| {
            let a = a.clone();
            answer_approval(a.handle, a.approval_id, a.approve, a.reason)
        });
        // After an action the rows are read again (the event usually asks too).
        Effect::new(move |prev: Option<(usize, usize)>| {
            let v = (act.version().get(), answer.version().get());
            if prev.is_some_and(|p| p != v) {
                list.refetch();
            }
            v
        });
        let confirming = Confirming::new();
        // Once a confirmed action is answered, the focus goes back to its
        // seat's row (its first action the person may use), each time the
        // rows are drawn again, until the rows read after the answer are.
        let draws = StoredValue::new(0u8);
        Effect::new(move |_| {
            let read = list.get().is_some();
            let done = !act.pending().get();
            if read
                && done
                && let Some(h) = confirming.focus_after.get_untracked()
            {
                focus_row(h);
                // The answer's draw, then the rows read after it.
                draws.update_value(|n| *n += 1);
                if draws.get_value() >= 2 {
                    draws.set_value(0);
                    confirming.focus_after.set(None);
                }
            }
        });
        let moving = Moving::new(list);
        SeatActions {
            operator,
            act,
            answer,
            confirming,
            moving,
            ask: Callback::new(move |c: Confirm| confirming.open(c)),
            ask_move: Callback::new(move |m: MoveAsk| moving.open(m)),
        }
    }
}

#[component]
pub fn SeatsPage() -> impl IntoView {
    let query = use_query_map();
    let text = Signal::derive(move || query.with(|q| q.get("q").unwrap_or_default()));
    let state = Signal::derive(move || query.with(|q| q.get("state").unwrap_or_default()));
    let page = move || query.with(super::page_param);
    let list: Listed = Resource::new(
        move || (text.get(), state.get(), page()),
        |(q, s, p)| list_seats(q, s, p),
    );
    let (live, rows) = follow_seats(list);
    let a = SeatActions::new(list);

    view! {
        <section class="page">
            <div class="page-head">
                <leptos_meta::Title text="Seats" />
                <h1>"Seats"</h1>
                <LiveBadge state=live />
            </div>
            <SeatFilters text state />
            <ActNotice act=a.act />
            <AnswerNotice answer=a.answer />
            <MovedNotice moved=a.moving.moved />
            <Transition fallback=|| view! { <p class="muted">"Reading the seats…"</p> }>
                {move || {
                    list.get()
                        .map(|r| match r {
                            Ok(l) => view! { <SeatSummary list=l operator=a.operator /> }.into_any(),
                            Err(e) => view! { <ErrorNotice error=e /> }.into_any(),
                        })
                }}
                <SeatsTable rows operator=a.operator ask=a.ask ask_move=a.ask_move answer=a.answer />
                <SeatPager list text state />
            </Transition>
            <ConfirmDialog confirming=a.confirming act=a.act />
            <MoveDialog moving=a.moving />
        </section>
    }
}

/// One seat's row with its actions (pause, resume, stop, move, approvals)
/// and their dialogs, as the Seats page has them — for the seat's own page.
#[component]
pub fn SeatControls(handle: String) -> impl IntoView {
    let wanted = handle.clone();
    let list: Listed = Resource::new(
        move || handle.clone(),
        |h| async move {
            let mut l = list_seats(h.clone(), String::new(), 1).await?;
            l.rows.retain(|r| r.handle == h);
            Ok(l)
        },
    );
    let (live, rows) = follow_seats(list);
    let a = SeatActions::new(list);
    view! {
        <div class="seat-controls" data-controls=wanted>
            <LiveBadge state=live />
            <ActNotice act=a.act />
            <AnswerNotice answer=a.answer />
            <MovedNotice moved=a.moving.moved />
            <Transition fallback=|| view! { <p class="muted">"Reading the seat…"</p> }>
                {move || list.get().and_then(|r| r.err()).map(|e| view! { <ErrorNotice error=e /> })}
                <SeatsTable rows operator=a.operator ask=a.ask ask_move=a.ask_move answer=a.answer />
            </Transition>
            <ConfirmDialog confirming=a.confirming act=a.act />
            <MoveDialog moving=a.moving />
        </div>
    }
}

/// Follow the seat events, reading `list` again when one may change it:
/// the stream's state, and the rows shown (remembered, so that turn and
/// run events only count for the seats on this page — their running turn,
/// inbox depth, last error and detached runs; everything else may change
/// any row or the counts).
fn follow_seats(list: Listed) -> (ReadSignal<Connection>, Signal<Vec<SeatRow>>) {
    let on_page = StoredValue::new(Vec::<String>::new());
    let live = refetch_on(
        SEAT_EVENTS,
        move |e| {
            let seat_scoped = e.name.starts_with("turn")
                || e.name.starts_with("run_")
                || e.name == "sandbox_run_failed";
            !seat_scoped
                || e.seat()
                    .is_some_and(|s| on_page.try_with_value(|v| v.contains(&s)).unwrap_or(false))
        },
        move || list.refetch(),
    );
    let rows = Signal::derive(move || {
        let rows = list
            .get()
            .and_then(|r| r.ok())
            .map(|l| l.rows)
            .unwrap_or_default();
        on_page.set_value(rows.iter().map(|r| r.handle.clone()).collect());
        rows
    });
    (live, rows)
}

/// The search and state filter, submitted as the page's query.
#[component]
fn SeatFilters(text: Signal<String>, state: Signal<String>) -> impl IntoView {
    view! {
        <Form method="get" action="/seats" attr:class="filters">
            <label for="seat-q">"Search"</label>
            <input
                id="seat-q"
                type="search"
                name="q"
                placeholder="handle or node"
                maxlength="200"
                value=text
            />
            <label for="seat-state">"State"</label>
            <select id="seat-state" name="state">
                <option value="" selected=move || state.get().is_empty()>
                    "any"
                </option>
                {SeatState::ALL
                    .into_iter()
                    .map(|st| {
                        view! {
                            <option value=st.as_str() selected=move || state.get() == st.as_str()>
                                {st.as_str()}
                            </option>
                        }
                    })
                    .collect_view()}
            </select>
            <button type="submit">"Filter"</button>
        </Form>
    }
}

/// What the last pause, resume or stop came to.
#[component]
fn ActNotice(act: SeatAct) -> impl IntoView {
    move || {
        act.value().get().map(|r| match r {
            Ok(done) => view! {
                <p class="notice notice-info" role="status" data-result=done.seat.clone()>
                    {format!("{}: {}", done.seat, done.result)}
                </p>
            }
            .into_any(),
            Err(e) => view! { <ErrorNotice error=e /> }.into_any(),
        })
    }
}

/// The move last recorded.
#[component]
fn MovedNotice(moved: RwSignal<Option<MoveRequestView>>) -> impl IntoView {
    move || {
        moved.get().map(|m| {
            view! {
                <p class="notice notice-info" role="status" data-moved=m.seat.clone()>
                    {format!(
                        "{}: move to {} requested ({}). Its holder hands it over; Settings › Nodes shows the handoff.",
                        m.seat,
                        m.to,
                        m.reason,
                    )}
                </p>
            }
        })
    }
}

/// The rows of the page. They are keyed by their content: a refresh
/// replaces only the rows that changed, so the others keep their place and
/// focus.
#[component]
fn SeatsTable(
    rows: Signal<Vec<SeatRow>>,
    operator: Signal<bool>,
    ask: Callback<Confirm>,
    ask_move: Callback<MoveAsk>,
    answer: Answering,
) -> impl IntoView {
    view! {
        <div class="table-wrap" hidden=move || rows.get().is_empty()>
            <table class="seats-table">
                <thead>
                    <tr>
                        <th scope="col">"Seat"</th>
                        <th scope="col">"Holder"</th>
                        <th scope="col">"State"</th>
                        <th scope="col">"Inbox"</th>
                        <th scope="col">"Last turn error"</th>
                        <th scope="col">"Actions"</th>
                    </tr>
                </thead>
                <tbody>
                    <For each=move || rows.get() key=|r| format!("{r:?}") let:r>
                        <SeatRowView row=r operator=operator ask=ask ask_move=ask_move answer=answer />
                    </For>
                </tbody>
            </table>
        </div>
    }
}

/// Links to the other pages of the same query.
#[component]
fn SeatPager(list: Listed, text: Signal<String>, state: Signal<String>) -> impl IntoView {
    move || {
        list.get().and_then(|r| r.ok()).map(|l| {
            let (query, state) = (text.get(), state.get());
            view! {
                <Pager
                    label="Seat pages"
                    page=l.page
                    pages=l.pages
                    matching=l.matching
                    href=move |p| seats_href(&query, &state, p)
                />
            }
        })
    }
}

/// The pause / resume / stop confirmation: the seat it is about, and the
/// reason and "also stop" being filled in.
#[derive(Clone, Copy)]
struct Confirming {
    dialog: NodeRef<leptos::html::Dialog>,
    confirm: RwSignal<Option<Confirm>>,
    reason: RwSignal<String>,
    stop_too: RwSignal<bool>,
    /// The seat whose row gets the focus back once its confirmed action
    /// is answered and the rows are drawn again.
    focus_after: RwSignal<Option<String>>,
}

impl Confirming {
    fn new() -> Confirming {
        Confirming {
            dialog: NodeRef::new(),
            confirm: RwSignal::new(None),
            reason: RwSignal::new(String::new()),
            stop_too: RwSignal::new(false),
            focus_after: RwSignal::new(None),
        }
    }

    fn open(self, c: Confirm) {
        self.reason.set(String::new());
        self.stop_too.set(false);
        self.confirm.set(Some(c));
        if let Some(d) = self.dialog.get() {
            let _ = d.show_modal();
        }
        // Into the form once it is drawn: the reason, or the confirming
        // button when there is none (a keyboard answers at once).
        focus_first("dialog.confirm #confirm-reason, dialog.confirm button.primary");
    }

    fn close(self) {
        if let Some(d) = self.dialog.get() {
            d.close();
        }
    }
}

/// Focus seat `handle`'s row — its first enabled action — once the rows
/// have been drawn.
fn focus_row(handle: String) {
    focus_first(&format!(
        "tr[data-seat=\"{handle}\"] .actions button:not([disabled])"
    ));
}

/// Focus the first element `selector` finds, once the page is drawn.
fn focus_first(selector: &str) {
    #[cfg(feature = "hydrate")]
    {
        let selector = selector.to_string();
        request_animation_frame(move || {
            use wasm_bindgen::JsCast;
            if let Some(el) = document()
                .query_selector(&selector)
                .ok()
                .flatten()
                .and_then(|e| e.dyn_into::<web_sys::HtmlElement>().ok())
            {
                let _ = el.focus();
            }
        });
    }
    #[cfg(not(feature = "hydrate"))]
    let _ = selector;
}

#[component]
fn SeatSummary(list: SeatList, operator: Signal<bool>) -> impl IntoView {
    let counts = list
        .counts
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(st, n)| format!("{n} {}", st.as_str()))
        .collect::<Vec<_>>()
        .join(" · ");
    let summary = format!(
        "{} · revision {} · {} seat{}{} · answered by {}",
        list.company,
        list.revision,
        list.total,
        if list.total == 1 { "" } else { "s" },
        if counts.is_empty() {
            String::new()
        } else {
            format!(" ({counts})")
        },
        list.answered_by,
    );
    let none = list.rows.is_empty();
    view! {
        <p class="muted">{summary}</p>
        {move || {
            (!operator.get())
                .then(|| {
                    view! {
                        <p class="muted small">
                            "You are signed in as a viewer: only operators may pause, resume, stop or move seats."
                        </p>
                    }
                })
        }}
        {none.then(|| view! { <p class="muted">"No seat matches."</p> })}
    }
}

/// What the last answer to an approval came to.
#[component]
fn AnswerNotice(answer: Answering) -> impl IntoView {
    move || {
        answer.value().get().map(|r| match r {
            Ok(a) => {
                let text = format!(
                    "{} {} ({}).",
                    a.tool,
                    a.decision.as_deref().unwrap_or("answered"),
                    a.seat
                );
                view! { <p class="notice notice-info" role="status" data-answered=a.approval_id>{text}</p> }
                    .into_any()
            }
            Err(e) => view! { <ErrorNotice error=e /> }.into_any(),
        })
    }
}
