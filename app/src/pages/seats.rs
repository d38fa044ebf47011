//! Seats: every seat of the active company revision — holder, state,
//! pause, inbox depth and last turn error — searched, filtered and paged by
//! the node, with Pause / Resume / Stop turn for operators (each confirmed
//! in a dialog naming the seat and its holder) and Move… (a dialog picking
//! a live node and asking why; a refusal is shown in it, as the node words
//! it), refreshed live from the event stream.

use leptos::prelude::*;
use leptos_router::components::Form;
use leptos_router::hooks::use_query_map;

use crate::api::{MoveRequestView, SeatActionResult, SeatList, SeatRow, SeatState, runs_summary};
use crate::components::notice::ErrorNotice;
use crate::components::pager::Pager;
use crate::error::AppError;
use crate::fns::{fleet, list_seats, move_seat, pause_seat, resume_seat, stop_seat_turn, whoami};
use crate::live::{LiveBadge, SEAT_EVENTS, refetch_on};

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

/// `HH:MM` of an RFC 3339 timestamp (UTC, as the node writes them).
fn hhmm(at: &str) -> String {
    at.get(11..16).unwrap_or(at).to_string()
}

fn seats_href(query: &str, state: &str, page: u32) -> String {
    super::page_href("/seats", &[("q", query), ("state", state)], page)
}

#[component]
pub fn SeatsPage() -> impl IntoView {
    let query = use_query_map();
    let text = move || query.with(|q| q.get("q").unwrap_or_default());
    let state = move || query.with(|q| q.get("state").unwrap_or_default());
    let page = move || query.with(super::page_param);
    let list = Resource::new(
        move || (text(), state(), page()),
        |(q, s, p)| list_seats(q, s, p),
    );
    let me = Resource::new(|| (), |_| whoami());
    let operator = Signal::derive(move || {
        me.get()
            .and_then(|r| r.ok())
            .is_some_and(|p| p.is_operator())
    });

    // Turn and run events only matter for the seats on this page (their
    // running turn, inbox depth, last error and detached runs); everything
    // else may change any row or the counts.
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

    let rows = move || {
        let rows = list
            .get()
            .and_then(|r| r.ok())
            .map(|l| l.rows)
            .unwrap_or_default();
        on_page.set_value(rows.iter().map(|r| r.handle.clone()).collect());
        rows
    };

    let act = Action::new(|r: &Request| run(r.clone()));
    // After an action the rows are read again (the event usually asks too).
    Effect::new(move |prev: Option<usize>| {
        let v = act.version().get();
        if prev.is_some_and(|p| p != v) {
            list.refetch();
        }
        v
    });

    let dialog = NodeRef::<leptos::html::Dialog>::new();
    let confirm = RwSignal::new(None::<Confirm>);
    let reason = RwSignal::new(String::new());
    let stop_too = RwSignal::new(false);
    let ask = Callback::new(move |c: Confirm| {
        reason.set(String::new());
        stop_too.set(false);
        confirm.set(Some(c));
        if let Some(d) = dialog.get() {
            let _ = d.show_modal();
        }
    });
    let close = move || {
        if let Some(d) = dialog.get() {
            d.close();
        }
    };

    // Move…: the live nodes are read when the dialog opens; a refusal
    // stays in the dialog, a recorded request closes it.
    let move_dialog = NodeRef::<leptos::html::Dialog>::new();
    let moving = RwSignal::new(None::<MoveAsk>);
    let move_to = RwSignal::new(String::new());
    let move_reason = RwSignal::new(String::new());
    let move_error = RwSignal::new(None::<AppError>);
    let moved = RwSignal::new(None::<MoveRequestView>);
    let live_nodes = Action::new(|_: &()| fleet());
    let move_act = Action::new(|r: &MoveRequest| {
        move_seat(r.handle.clone(), r.node.clone(), r.reason.clone())
    });
    let close_move = move || {
        if let Some(d) = move_dialog.get() {
            d.close();
        }
    };
    let ask_move = Callback::new(move |m: MoveAsk| {
        move_to.set(String::new());
        move_reason.set(String::new());
        move_error.set(None);
        moving.set(Some(m));
        live_nodes.dispatch(());
        if let Some(d) = move_dialog.get() {
            let _ = d.show_modal();
        }
    });
    // The first live node that does not hold the seat is picked to start.
    Effect::new(move |_| {
        if let Some(Ok(f)) = live_nodes.value().get()
            && move_to.get_untracked().is_empty()
        {
            let holder = moving.get_untracked().and_then(|m| m.holder);
            let pick = f
                .nodes
                .iter()
                .find(|n| Some(&n.node_id) != holder.as_ref())
                .or(f.nodes.first())
                .map(|n| n.node_id.clone());
            if let Some(p) = pick {
                move_to.set(p);
            }
        }
    });
    Effect::new(move |prev: Option<usize>| {
        let v = move_act.version().get();
        if prev.is_some_and(|p| p != v) {
            match move_act.value().get_untracked() {
                Some(Ok(req)) => {
                    move_error.set(None);
                    moved.set(Some(req));
                    close_move();
                    list.refetch();
                }
                Some(Err(e)) => move_error.set(Some(e)),
                None => {}
            }
        }
        v
    });

    view! {
        <section class="page">
            <div class="page-head">
                <h1>"Seats"</h1>
                <LiveBadge state=live />
            </div>
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
                    <option value="" selected=move || state().is_empty()>
                        "any"
                    </option>
                    {SeatState::ALL
                        .into_iter()
                        .map(|st| {
                            view! {
                                <option value=st.as_str() selected=move || state() == st.as_str()>
                                    {st.as_str()}
                                </option>
                            }
                        })
                        .collect_view()}
                </select>
                <button type="submit">"Filter"</button>
            </Form>
            {move || {
                act.value()
                    .get()
                    .map(|r| match r {
                        Ok(done) => {
                            view! {
                                <p class="notice notice-info" role="status" data-result=done.seat.clone()>
                                    {format!("{}: {}", done.seat, done.result)}
                                </p>
                            }
                                .into_any()
                        }
                        Err(e) => view! { <ErrorNotice error=e /> }.into_any(),
                    })
            }}
            {move || {
                moved
                    .get()
                    .map(|m| {
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
            }}
            <Transition fallback=|| view! { <p class="muted">"Reading the seats…"</p> }>
                {move || {
                    list.get()
                        .map(|r| match r {
                            Ok(l) => view! { <SeatSummary list=l operator=operator /> }.into_any(),
                            Err(e) => view! { <ErrorNotice error=e /> }.into_any(),
                        })
                }}
                // Rows are keyed by their content: a refresh replaces only the
                // rows that changed, so the others keep their place and focus.
                <div class="table-wrap" hidden=move || rows().is_empty()>
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
                            <For each=rows key=|r| format!("{r:?}") let:r>
                                <SeatRowView row=r operator=operator ask=ask ask_move=ask_move />
                            </For>
                        </tbody>
                    </table>
                </div>
                {move || {
                    list.get()
                        .and_then(|r| r.ok())
                        .map(|l| {
                            let (query, state) = (text(), state());
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
                }}
            </Transition>
            <dialog
                node_ref=dialog
                class="confirm"
                aria-labelledby="confirm-title"
                on:close=move |_| confirm.set(None)
            >
                {move || {
                    confirm
                        .get()
                        .map(|c| {
                            let node = c.holder.clone();
                            let (title, body) = match (c.ask, &node) {
                                (Ask::Pause, Some(n)) => (
                                    format!("Pause {}?", c.handle),
                                    format!("{n} holds it: it keeps the seat's mail and starts no new turn until a resume."),
                                ),
                                (Ask::Pause, None) => (
                                    format!("Pause {}?", c.handle),
                                    "Nobody holds it now: the node that takes it keeps its mail until a resume.".to_string(),
                                ),
                                (Ask::Resume, Some(n)) => (
                                    format!("Resume {}?", c.handle),
                                    format!("{n} holds it: its turns start again."),
                                ),
                                (Ask::Resume, None) => (
                                    format!("Resume {}?", c.handle),
                                    "Nobody holds it now: the node that takes it runs its turns.".to_string(),
                                ),
                                (Ask::Stop, Some(n)) => (
                                    format!("Stop {}'s running turn?", c.handle),
                                    format!("{n} holds it: the running turn ends at its next round. The seat is not paused."),
                                ),
                                (Ask::Stop, None) => (
                                    format!("Stop {}'s running turn?", c.handle),
                                    "Nobody holds it now, so no turn is running.".to_string(),
                                ),
                            };
                            let Confirm { ask, handle, .. } = c;
                            view! {
                                <form
                                    data-confirm=ask.name()
                                    on:submit=move |ev| {
                                        ev.prevent_default();
                                        act.dispatch(Request {
                                            ask,
                                            handle: handle.clone(),
                                            reason: reason.get_untracked(),
                                            stop_running_turn: ask == Ask::Pause && stop_too.get_untracked(),
                                        });
                                        close();
                                    }
                                >
                                    <h2 id="confirm-title">{title}</h2>
                                    <p>{body}</p>
                                    {(ask != Ask::Resume)
                                        .then(|| {
                                            view! {
                                                <label for="confirm-reason">"Reason (optional)"</label>
                                                <input
                                                    id="confirm-reason"
                                                    type="text"
                                                    maxlength="500"
                                                    autocomplete="off"
                                                    bind:value=reason
                                                />
                                            }
                                        })}
                                    {(ask == Ask::Pause)
                                        .then(|| {
                                            view! {
                                                <label class="check">
                                                    <input id="confirm-stop" type="checkbox" bind:checked=stop_too />
                                                    "Also stop the running turn"
                                                </label>
                                            }
                                        })}
                                    <div class="dialog-actions">
                                        <button type="button" on:click=move |_| close()>"Cancel"</button>
                                        <button type="submit" class="primary">{ask.button()}</button>
                                    </div>
                                </form>
                            }
                        })
                }}
            </dialog>
            <dialog
                node_ref=move_dialog
                class="move-dialog"
                aria-labelledby="move-title"
                on:close=move |_| moving.set(None)
            >
                {move || {
                    moving
                        .get()
                        .map(|m| {
                            let body = match &m.holder {
                                Some(n) => format!(
                                    "{n} holds it now. It hands the seat over once the node you pick has it ready; no turn runs on both."
                                ),
                                None => "Nobody holds it now: the node you pick claims it.".to_string(),
                            };
                            let holder = m.holder.clone();
                            let handle = m.handle.clone();
                            view! {
                                <form
                                    data-confirm="move"
                                    on:submit=move |ev| {
                                        ev.prevent_default();
                                        move_error.set(None);
                                        move_act.dispatch(MoveRequest {
                                            handle: handle.clone(),
                                            node: move_to.get_untracked(),
                                            reason: move_reason.get_untracked(),
                                        });
                                    }
                                >
                                    <h2 id="move-title">{format!("Move {}", m.handle)}</h2>
                                    <p>{body}</p>
                                    <label for="move-node">"To node"</label>
                                    <select
                                        id="move-node"
                                        required
                                        on:change=move |ev| move_to.set(event_target_value(&ev))
                                    >
                                        {move || match live_nodes.value().get() {
                                            None => {
                                                view! {
                                                    <option value="" disabled selected>
                                                        "Reading the live nodes…"
                                                    </option>
                                                }
                                                    .into_any()
                                            }
                                            Some(Err(_)) => {
                                                view! {
                                                    <option value="" disabled selected>
                                                        "The live nodes cannot be read"
                                                    </option>
                                                }
                                                    .into_any()
                                            }
                                            Some(Ok(f)) => {
                                                let holder = holder.clone();
                                                f.nodes
                                                    .into_iter()
                                                    .map(|n| {
                                                        let id = n.node_id.clone();
                                                        let here = holder.as_deref() == Some(id.as_str());
                                                        let label = format!(
                                                            "{id} ({}{})",
                                                            n.status.as_str(),
                                                            if here { ", holds it now" } else { "" },
                                                        );
                                                        let sel = id.clone();
                                                        view! {
                                                            <option value=id selected=move || move_to.get() == sel>
                                                                {label}
                                                            </option>
                                                        }
                                                    })
                                                    .collect_view()
                                                    .into_any()
                                            }
                                        }}
                                    </select>
                                    <label for="move-reason">"Reason (required; it is audited)"</label>
                                    <input
                                        id="move-reason"
                                        type="text"
                                        required
                                        maxlength="500"
                                        autocomplete="off"
                                        bind:value=move_reason
                                    />
                                    {move || {
                                        move_error
                                            .get()
                                            .map(|e| {
                                                view! {
                                                    <p class="notice notice-error" role="alert" data-move-error="true">
                                                        {e.to_string()}
                                                    </p>
                                                }
                                            })
                                    }}
                                    <div class="dialog-actions">
                                        <button type="button" on:click=move |_| close_move()>"Cancel"</button>
                                        <button
                                            type="submit"
                                            class="primary"
                                            disabled=move || move_act.pending().get()
                                        >
                                            "Move"
                                        </button>
                                    </div>
                                </form>
                            }
                        })
                }}
            </dialog>
        </section>
    }
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

#[component]
fn SeatRowView(
    row: SeatRow,
    operator: Signal<bool>,
    ask: Callback<Confirm>,
    ask_move: Callback<MoveAsk>,
) -> impl IntoView {
    let state = row.state.as_str();
    let holder_node = row.holder.as_ref().map(|h| h.node_id.clone());
    let paused = row.pause.is_some();
    let button = |a: Ask| {
        let confirm = Confirm {
            ask: a,
            handle: row.handle.clone(),
            holder: holder_node.clone(),
        };
        let label = format!("{} {}", a.button(), row.handle);
        view! {
            <button
                type="button"
                data-action=a.name()
                aria-label=label
                disabled=move || !operator.get()
                on:click=move |_| ask.run(confirm.clone())
            >
                {a.button()}
            </button>
        }
    };
    let first = if paused {
        button(Ask::Resume)
    } else {
        button(Ask::Pause)
    };
    let stop = button(Ask::Stop);
    let move_button = {
        let m = MoveAsk {
            handle: row.handle.clone(),
            holder: holder_node.clone(),
        };
        let label = format!("Move {} to another node", row.handle);
        view! {
            <button
                type="button"
                data-action="move"
                aria-label=label
                disabled=move || !operator.get()
                on:click=move |_| ask_move.run(m.clone())
            >
                "Move…"
            </button>
        }
    };
    view! {
        <tr data-seat=row.handle.clone() data-state=state>
            <td data-label="Seat">
                <strong class="mono">{row.handle.clone()}</strong>
                <div class="muted small">{row.placement.clone()}</div>
            </td>
            <td data-label="Holder">
                {match row.holder.clone() {
                    Some(h) => {
                        let since = h.since.clone();
                        view! {
                            <span class="holder">{h.node_id.clone()}</span>
                            <div class="muted small">
                                "since "
                                <time datetime=since.clone() title=since.clone()>{hhmm(&since)}</time>
                                {format!(" · epoch {}", h.epoch)}
                            </div>
                        }
                            .into_any()
                    }
                    None => view! { <span class="muted">"nobody"</span> }.into_any(),
                }}
            </td>
            <td data-label="State">
                <span class=format!("badge badge-{state}")>{state}</span>
                {row
                    .pause
                    .clone()
                    .map(|p| {
                        let at = p.at.clone();
                        view! {
                            <div class="muted small pause-note">
                                {format!("paused by {} · ", p.by)}
                                <time datetime=at.clone() title=at.clone()>{hhmm(&at)}</time>
                                {p.reason.map(|r| format!(" · {r}"))}
                                {p.stop_running_turn.then_some(" · turn stopped")}
                            </div>
                        }
                    })}
                {row
                    .running_turn
                    .clone()
                    .map(|t| {
                        view! {
                            <div class="small running-turn" data-turn=t.clone() title=t>
                                "running turn"
                            </div>
                        }
                    })}
                {runs_summary(&row.runs)
                    .map(|text| {
                        let live = row.runs.iter().filter(|r| r.state == "running" || r.state == "parked").count();
                        view! {
                            <div class="muted small runs" data-runs=row.runs.len() data-live-runs=live>
                                {text}
                            </div>
                        }
                    })}
            </td>
            <td data-label="Inbox" class="num">
                <span class="pending">
                    {match row.pending {
                        Some(n) => n.to_string(),
                        None => "—".to_string(),
                    }}
                </span>
            </td>
            <td data-label="Last turn error" class="error-cell">
                {match (row.last_error.clone(), row.last_error_node.clone()) {
                    (Some(e), node) => {
                        view! {
                            <span class="bad small" title=e.clone()>{e.clone()}</span>
                            {node.map(|n| view! { <div class="muted small">{format!("on {n}")}</div> })}
                        }
                            .into_any()
                    }
                    (None, _) => view! { <span class="muted">"—"</span> }.into_any(),
                }}
            </td>
            <td data-label="Actions">
                <div class="actions">{first} {stop} {move_button}</div>
            </td>
        </tr>
    }
}
