//! One seat's row of the seat list: who holds it, its state (pause, the
//! running turn, detached runs, spend, tool servers), inbox depth, last
//! turn error and the actions, with its pending approvals beneath.

use leptos::prelude::*;

use super::*;

#[component]
pub(super) fn SeatRowView(
    row: SeatRow,
    operator: Signal<bool>,
    ask: Callback<Confirm>,
    ask_move: Callback<MoveAsk>,
    answer: Answering,
) -> impl IntoView {
    let state = row.state.as_str();
    view! {
        <tr data-seat=row.handle.clone() data-state=state>
            <td data-label="Seat">
                <a class="mono seat-link" href=format!("/seats/{}", row.handle)>
                    <strong>{row.handle.clone()}</strong>
                </a>
                <div class="muted small">{row.placement.clone()}</div>
            </td>
            <td data-label="Holder">
                {match row.holder.clone() {
                    Some(h) => {
                        let since = h.since.clone();
                        view! {
                            <a class="holder node-link" href=format!("/nodes/{}", h.node_id)>{h.node_id.clone()}</a>
                            <div class="muted small">
                                "since "
                                <crate::components::time::When at=since.clone() />
                                {format!(" · epoch {}", h.epoch)}
                            </div>
                        }
                            .into_any()
                    }
                    None => view! { <span class="muted">"nobody"</span> }.into_any(),
                }}
            </td>
            <SeatStateCell row=row.clone() />
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
            <SeatActionsCell row=row.clone() operator ask ask_move />
        </tr>
        <ApprovalsRow row=row.clone() operator answer />
    }
}

/// A seat row's Actions cell: pause or resume, stop the running turn,
/// move; each disabled for a viewer, and stop while no turn runs, move
/// while the seat has nowhere to go.
#[component]
fn SeatActionsCell(
    row: SeatRow,
    operator: Signal<bool>,
    ask: Callback<Confirm>,
    ask_move: Callback<MoveAsk>,
) -> impl IntoView {
    let holder_node = row.holder.as_ref().map(|h| h.node_id.clone());
    let paused = row.pause.is_some();
    let idle = row.running_turn.is_none();
    let button = |a: Ask| {
        let confirm = Confirm {
            ask: a,
            handle: row.handle.clone(),
            holder: holder_node.clone(),
        };
        let label = format!("{} {}", a.button(), row.handle);
        // Stop turn only while a turn runs.
        let nothing_to_stop = a == Ask::Stop && idle;
        view! {
            <button
                type="button"
                data-action=a.name()
                aria-label=label
                title=nothing_to_stop.then_some("No turn is running")
                disabled=move || !operator.get() || nothing_to_stop
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
        let blocked = row.move_blocked.clone();
        let label = match &blocked {
            Some(why) => format!("Move {}: {why}", row.handle),
            None => format!("Move {} to another node", row.handle),
        };
        let nowhere = blocked.is_some();
        view! {
            <button
                type="button"
                data-action="move"
                aria-label=label
                title=blocked
                disabled=move || !operator.get() || nowhere
                on:click=move |_| ask_move.run(m.clone())
            >
                "Move…"
            </button>
        }
    };
    view! {
        <td data-label="Actions">
            <div class="actions">{first} {stop} {move_button}</div>
        </td>
    }
}

/// A seat row's State cell: the state, a pause, the running turn, the
/// detached runs, a model seat's spend and the tool servers.
#[component]
fn SeatStateCell(row: SeatRow) -> impl IntoView {
    let state = row.state.as_str();
    view! {
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
                            <crate::components::time::When at=at.clone() />
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
            {row
                .spend
                .clone()
                .map(|s| {
                    let held = s.held;
                    view! {
                        <div class="muted small spend" data-held=held.to_string()>
                            {spend_summary(&s)}
                        </div>
                    }
                })}
            {tool_servers_summary(&row.tool_servers)
                .map(|text| {
                    let up = row.tool_servers.iter().filter(|s| s.state == "running").count();
                    view! {
                        <div
                            class="muted small tool-servers"
                            data-tool-servers=row.tool_servers.len()
                            data-tool-servers-up=up
                        >
                            {text}
                        </div>
                    }
                })}
        </td>
    }
}

/// The row under a seat with its tool calls waiting for a person, if any.
#[component]
fn ApprovalsRow(row: SeatRow, operator: Signal<bool>, answer: Answering) -> impl IntoView {
    (!row.approvals.is_empty()).then(|| {
        view! {
            <tr class="approvals-row" data-approvals-for=row.handle.clone()>
                <td colspan="6">
                    <ul class="approvals">
                        {row
                            .approvals
                            .clone()
                            .into_iter()
                            .map(|a| view! { <ApprovalItem a operator answer /> })
                            .collect_view()}
                    </ul>
                </td>
            </tr>
        }
    })
}

/// One tool call waiting for a person: what it would do, until when, and
/// Approve / Deny with a reason (operators).
#[component]
fn ApprovalItem(a: ApprovalView, operator: Signal<bool>, answer: Answering) -> impl IntoView {
    let reason = RwSignal::new(String::new());
    let (handle, id) = (a.seat.clone(), a.approval_id.clone());
    let send = Callback::new(move |approve: bool| {
        answer.dispatch(Answer {
            handle: handle.clone(),
            approval_id: id.clone(),
            approve,
            reason: reason.get_untracked(),
        });
    });
    // Approve or Deny: only for operators, once a reason is given.
    let button = move |approve: bool| {
        let (action, text) = if approve {
            ("approve", "Approve")
        } else {
            ("deny", "Deny")
        };
        view! {
            <button
                type="button"
                data-action=action
                disabled=move || !operator.get() || reason.get().trim().is_empty()
                on:click=move |_| send.run(approve)
            >
                {text}
            </button>
        }
    };
    // The whole arguments, pretty-printed and scrollable: a person approves
    // what they can read, never a clipped part of it (the node refuses
    // arguments too large to show before asking).
    let args =
        serde_json::to_string_pretty(&a.arguments).unwrap_or_else(|_| a.arguments.to_string());
    let (asked, deadline) = (a.asked_at.clone(), a.deadline.clone());
    let label = format!("Why approve or deny {}", a.tool);
    view! {
        <li class="approval" data-approval=a.approval_id.clone() data-tool=a.tool.clone()>
            <strong>"Waiting for approval: "</strong>
            <span class="mono">{a.tool.clone()}</span>
            " "
            <pre class="small approval-args" tabindex="0" aria-label="The call's arguments">{args}</pre>
            <div class="muted small">
                "asked "
                <crate::components::time::When at=asked.clone() />
                " · denied as timed out at "
                <crate::components::time::When at=deadline.clone() />
            </div>
            <div class="actions">
                <input
                    type="text"
                    name="reason"
                    maxlength="500"
                    placeholder="Why (required)"
                    aria-label=label
                    disabled=move || !operator.get()
                    prop:value=move || reason.get()
                    on:input=move |ev| reason.set(event_target_value(&ev))
                />
                {button(true)}
                {button(false)}
            </div>
        </li>
    }
}
