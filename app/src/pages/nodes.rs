//! Settings › Nodes, the home page: alarms on top (undead seats and for how
//! long, seats no node may run, a protocol floor blocking claims), then
//! every live node of the fleet, its status, roles, labels, protocol,
//! presence and the seats it holds, refreshed live from the event stream
//! when a seat moves or a node comes or goes. Below the nodes: the fleet's
//! priority order (operators reorder and save it) and the handoffs seen
//! live ([`super::node_order`]).
//!
//! When the roster cannot be read — or the page's own event stream is lost,
//! so it cannot follow the fleet — the page does not guess: every node's
//! status is `unknown`, and the last roster read is shown greyed "as of
//! HH:MM:SS". While it cannot be read the page asks again every
//! [`STALE_RETRY_SECS`] seconds (an unreadable store sends no event when it
//! comes back); a stream that opens again brings a fresh read.
//!
//! Each node's presence counts down from the roster read. Renewals send no
//! event, so when a countdown reaches zero the page reads the roster once
//! more: a node that renewed shows its new expiry, one that did not is
//! gone or shown as the roster has it.

use std::collections::BTreeSet;

use leptos::prelude::*;

use crate::api::{FleetAlarm, FleetView, NodeView};
use crate::components::notice::{ErrorNotice, InfoNotice};
use crate::error::AppError;
use crate::fns::{fleet, node_order, whoami};
use crate::live::{Connection, HANDOFF_EVENTS, LiveBadge, NODE_EVENTS, refetch_on_and};
use crate::pages::node_order::{Handoffs, PriorityOrder};
use crate::view::{HandoffView, apply_handoff_event, duration_words, presence_left, unfollowed};

/// How often the page reads the roster again while it cannot be read.
pub const STALE_RETRY_SECS: u64 = 5;

#[component]
pub fn NodesPage() -> impl IntoView {
    let data = Resource::new(|| (), |_| fleet());
    let order = Resource::new(|| (), |_| node_order());
    let me = Resource::new(|| (), |_| whoami());
    let operator = Signal::derive(move || {
        me.get()
            .and_then(|r| r.ok())
            .is_some_and(|p| p.is_operator())
    });
    let handoffs = RwSignal::new(Vec::<HandoffView>::new());
    // A blocked claim is reported at every sweep while it lasts: once the
    // page shows the floor, those reports change nothing.
    let floor_shown = StoredValue::new(false);
    let live = refetch_on_and(
        NODE_EVENTS,
        move |e| {
            e.name != "seat_claims_blocked_by_older_protocol"
                || !floor_shown.try_get_value().unwrap_or(true)
        },
        move || {
            data.refetch();
            order.refetch();
        },
        move |e| {
            if HANDOFF_EVENTS.contains(&e.name.as_str()) {
                handoffs.update(|l| apply_handoff_event(l, &e.name, &e.data));
            }
        },
    );
    follow_unreadable(data, floor_shown);
    let ticks = presence_clock(data);

    // Which nodes' seat lists are open, kept across refreshes.
    let open = RwSignal::new(BTreeSet::<String>::new());
    view! {
        <section class="page">
            <div class="page-head">
                <leptos_meta::Title text="Nodes" />
                <h1>"Settings › Nodes"</h1>
                <LiveBadge state=live />
            </div>
            <Transition fallback=|| view! { <p class="muted">"Reading the fleet…"</p> }>
                {move || {
                    data.get()
                        .map(|r| match r {
                            Ok(f) => view! { <FleetHead fleet=shown(f, live.get()) ticks=ticks /> }.into_any(),
                            Err(e) => view! { <ErrorNotice error=e /> }.into_any(),
                        })
                }}
                <NodesTable data live open ticks />
                <PriorityOrder order=order operator=operator />
            </Transition>
            <Handoffs list=handoffs />
            <crate::pages::node_trends::NodeStrips />
        </section>
    }
}

/// While the roster cannot be read, read it again a while later; and note
/// whether the page shows a protocol floor (its reports then change
/// nothing).
fn follow_unreadable(data: Resource<Result<FleetView, AppError>>, floor_shown: StoredValue<bool>) {
    Effect::new(move |_| {
        let unreadable = data.with(|d| match d {
            Some(Ok(f)) => f.stale.is_some(),
            Some(Err(AppError::Unavailable(_))) => true,
            _ => false,
        });
        floor_shown.set_value(data.with(|d| {
            matches!(d, Some(Ok(f)) if f.alarms.iter().any(|a| matches!(a, FleetAlarm::ProtocolFloor { .. })))
        }));
        if unreadable
            && let Ok(h) = set_timeout_with_handle(
                move || data.refetch(),
                std::time::Duration::from_secs(STALE_RETRY_SECS),
            )
        {
            on_cleanup(move || h.clear());
        }
    });
}

/// Seconds since the fleet shown was read, counting every second so
/// durations keep counting; a presence countdown at zero reads the roster
/// once more (once a read).
fn presence_clock(data: Resource<Result<FleetView, AppError>>) -> RwSignal<u64> {
    let ticks = RwSignal::new(0u64);
    // Whether this read's presence countdowns already asked for a new read.
    let expiry_asked = StoredValue::new(false);
    Effect::new(move |_| {
        data.track();
        ticks.set(0);
        expiry_asked.set_value(false);
    });
    // A presence countdown at zero: read the roster once more.
    Effect::new(move |_| {
        let t = ticks.get();
        let due = data.with_untracked(|d| match d {
            Some(Ok(f)) if f.stale.is_none() => f
                .nodes
                .iter()
                .any(|n| presence_left(n, &f.read_at, t) == Some(0)),
            _ => false,
        });
        if due && !expiry_asked.get_value() {
            expiry_asked.set_value(true);
            data.refetch();
        }
    });
    Effect::new(move |_| {
        if let Ok(h) = set_interval_with_handle(
            move || ticks.update(|t| *t += 1),
            std::time::Duration::from_secs(1),
        ) {
            on_cleanup(move || h.clear());
        }
    });
    ticks
}

/// What the page shows of `f`: the fleet read, marked unknown while the
/// page cannot follow it (its stream is reconnecting).
fn shown(f: FleetView, stream: Connection) -> FleetView {
    if stream == Connection::Reconnecting {
        unfollowed(
            f,
            "this page's live event stream from the node is lost (reconnecting…), so it cannot follow the fleet.",
        )
    } else {
        f
    }
}

/// The nodes' table. Rows are keyed by the node's incarnation: a refresh
/// updates what changed inside a row and never replaces it, so rows keep
/// their place and focus. Drawn inside the page's loading boundary, where
/// its reads of the fleet wait with the rest of the page.
#[component]
fn NodesTable(
    data: Resource<Result<FleetView, AppError>>,
    live: ReadSignal<Connection>,
    open: RwSignal<BTreeSet<String>>,
    ticks: RwSignal<u64>,
) -> impl IntoView {
    // Read once per change of the fleet or the stream; every row looks its
    // node up in it (a row cloning the whole fleet would cost rows × seats).
    let fleet = Memo::new(move |_| {
        data.get()
            .and_then(|r| r.ok())
            .map(|f| shown(f, live.get()))
    });
    let nodes = move || fleet.with(|f| f.as_ref().map(|f| f.nodes.clone()).unwrap_or_default());
    let read_at = Signal::derive(move || {
        fleet.with(|f| {
            f.as_ref()
                .filter(|f| f.stale.is_some())
                .map(|f| f.read_at.clone())
        })
    });
    view! {
        <div class="table-wrap" hidden=move || nodes().is_empty()>
            <table class="nodes stack-table">
                <thead>
                    <tr>
                        <th scope="col">"Node"</th>
                        <th scope="col">"Status"</th>
                        <th scope="col">"Roles"</th>
                        <th scope="col">"Labels"</th>
                        <th scope="col">"Protocol"</th>
                        <th scope="col">"Presence"</th>
                        <th scope="col">"Seats"</th>
                    </tr>
                </thead>
                <tbody>
                    <For each=nodes key=|n| n.incarnation.clone() let:n>
                        <NodeRow
                            node=Memo::new(move |_| {
                                fleet
                                    .with(|f| {
                                        f.as_ref()
                                            .and_then(|f| {
                                                f.nodes
                                                    .iter()
                                                    .find(|x| x.incarnation == n.incarnation)
                                                    .cloned()
                                            })
                                    })
                                    .unwrap_or_else(|| n.clone())
                            })
                            open=open
                            stale_as_of=read_at
                            read_at=Signal::derive(move || {
                                fleet.with(|f| f.as_ref().map(|f| f.read_at.clone()).unwrap_or_default())
                            })
                            ticks=ticks
                        />
                    </For>
                </tbody>
            </table>
        </div>
    }
}

#[component]
fn FleetHead(fleet: FleetView, ticks: RwSignal<u64>) -> impl IntoView {
    let count = fleet.nodes.len();
    let stale = fleet.stale.clone().map(|why| {
        view! {
            <div class="notice notice-warn" role="alert" data-stale="true">
                <p>
                    <strong>"Node states are unknown: "</strong>
                    {why}
                </p>
                <p>
                    "The page does not guess. Below is the roster as last read, as of "
                    <crate::components::time::When at=fleet.read_at.clone() />
                    {format!("; it is read again every {STALE_RETRY_SECS} s until it can be.")}
                </p>
            </div>
        }
    });
    view! {
        {(!fleet.alarms.is_empty()).then(|| view! { <Alarms alarms=fleet.alarms.clone() ticks=ticks /> })}
        {stale}
        <p class="muted">
            {format!(
                "{} · coordination {} · {} live node{} · answered by {}",
                fleet.company,
                fleet.coordination,
                count,
                if count == 1 { "" } else { "s" },
                fleet.answered_by,
            )}
        </p>
        <InfoNotice>
            "Each node's seats are listed under it with their epoch and "
            <em>"since"</em>
            " (when the tenure began; it moves only when the epoch does). The page follows the fleet's events: when a seat moves or a node comes or goes it updates by itself."
        </InfoNotice>
    }
}

#[component]
fn Alarms(alarms: Vec<FleetAlarm>, ticks: RwSignal<u64>) -> impl IntoView {
    view! {
        <section class="alarms" aria-labelledby="alarms-title">
            <h2 id="alarms-title">{format!("Alarms ({})", alarms.len())}</h2>
            <ul>
                {alarms.into_iter().map(|a| view! { <Alarm alarm=a ticks=ticks /> }).collect_view()}
            </ul>
        </section>
    }
}

#[component]
fn Alarm(alarm: FleetAlarm, ticks: RwSignal<u64>) -> impl IntoView {
    match alarm {
        FleetAlarm::Unproven {
            seat,
            node,
            epoch,
            since,
            seconds,
        } => {
            let how_long = move || match seconds {
                Some(s) => format!(" for {}", duration_words(s + ticks.get())),
                None => String::new(),
            };
            let since = since.map(|at| {
                view! {
                    " (since "
                    <crate::components::time::When at=at.clone() />
                    ")"
                }
            });
            view! {
                <li class="alarm" data-alarm="unproven" data-seat=seat.clone()>
                    <strong>
                        <span class="mono">{seat.clone()}</span>
                        {format!(" is undead on {node}")}
                    </strong>
                    ": its teardown has been failing"
                    {how_long}
                    {since}
                    {format!(
                        ", epoch {epoch}. {node} keeps the lease, so no node runs the seat until the teardown succeeds (for a command agent: until its process exits)."
                    )}
                </li>
            }
            .into_any()
        }
        FleetAlarm::Unplaceable { seats } => {
            let n = seats.len();
            let (it, its, needs) = if n == 1 {
                ("it", "its", "needs")
            } else {
                ("they", "their", "need")
            };
            view! {
                <li class="alarm" data-alarm="unplaceable">
                    <strong>
                        {format!("{n} seat{} cannot be placed: ", if n == 1 { "" } else { "s" })}
                        <span class="mono">{seats.join(", ")}</span>
                        "."
                    </strong>
                    {format!(
                        " No live node matches {its} placement: start a node with the node id or labels {it} {needs}, or change {its} placement."
                    )}
                </li>
            }
            .into_any()
        }
        FleetAlarm::ProtocolFloor {
            floor,
            protocol,
            nodes,
            claims_blocked_here,
        } => view! {
            <li class="alarm" data-alarm="protocol_floor">
                <strong>{format!("Claims are blocked by protocol {floor}")}</strong>
                {format!(
                    ": {} hold{} leases at protocol {floor}, below this node's {protocol}. Nodes of protocol {protocol} claim no seat until {} leave{} the fleet.",
                    nodes.join(", "),
                    if nodes.len() == 1 { "s" } else { "" },
                    if nodes.len() == 1 { "it" } else { "they" },
                    if nodes.len() == 1 { "s" } else { "" },
                )}
                {claims_blocked_here.then_some(" This node's last claim was refused for it.")}
            </li>
        }
        .into_any(),
        FleetAlarm::DeadLetters { count } => view! {
            <li class="alarm" data-alarm="dead_letters" data-count=count>
                <strong>
                    {format!("{count} dead letter{} kept", if count == 1 { "" } else { "s" })}
                </strong>
                ": mail the queue gave up on reaches no seat until an operator re-publishes it. "
                <a href="/dead-letters">"See the dead letters"</a>
            </li>
        }
        .into_any(),
    }
}

/// One seat a node holds, linked to its page, with its epoch and since.
#[component]
pub fn HeldSeatItem(s: crate::api::HeldSeatView) -> impl IntoView {
    let since = s.since.clone();
    view! {
        <li data-seat=s.handle.clone()>
            <a class="mono seat-link" href=format!("/seats/{}", s.handle)>{s.handle.clone()}</a>
            <span class="muted small">
                {format!(" · epoch {} · since ", s.epoch)}
                <crate::components::time::When at=since.clone() />
            </span>
        </li>
    }
}

/// A node's presence: the time left on its lease, counting down from the
/// roster read, and when it expires; or that it holds none.
#[component]
fn NodePresence(
    node: Memo<NodeView>,
    read_at: Signal<String>,
    ticks: RwSignal<u64>,
) -> impl IntoView {
    move || match node.with(|n| n.presence_expires_at.clone()) {
        Some(at) => {
            let left = move || match presence_left(&node.get(), &read_at.get(), ticks.get()) {
                Some(0) => "renewal due".to_string(),
                Some(s) => format!("{} left", duration_words(s)),
                None => String::new(),
            };
            view! {
                <span class="presence-left" data-presence-left="">{left}</span>
                <div class="muted small">
                    "expires "
                    <crate::components::time::When at=at.clone() />
                </div>
            }
            .into_any()
        }
        None => view! { "no lease" }.into_any(),
    }
}

#[component]
fn NodeRow(
    /// The node as the page reads it now: the row stays while the node is
    /// in the roster, and only what changed in it is rendered anew (focus
    /// on its seat list survives a live update).
    node: Memo<NodeView>,
    open: RwSignal<BTreeSet<String>>,
    stale_as_of: Signal<Option<String>>,
    read_at: Signal<String>,
    ticks: RwSignal<u64>,
) -> impl IntoView {
    let key = node.with_untracked(|n| n.incarnation.clone());
    let is_open = {
        let key = key.clone();
        move || open.with(|o| o.contains(&key))
    };
    let on_toggle = move |ev: leptos::ev::Event| {
        let now_open = event_target::<leptos::web_sys::HtmlDetailsElement>(&ev).open();
        let key = key.clone();
        open.update(|o| {
            if now_open {
                o.insert(key);
            } else {
                o.remove(&key);
            }
        });
    };
    let status = move || node.with(|n| n.status.as_str());
    let last = move || node.with(|n| n.last_status.map(|s| s.as_str()));
    let list = |v: &[String]| {
        if v.is_empty() {
            "—".to_string()
        } else {
            v.join(", ")
        }
    };
    // The list is only built while it is open: a node holding hundreds of
    // seats costs one row until somebody looks.
    let seat_list = {
        let is_open = is_open.clone();
        move || {
            is_open().then(|| {
                view! {
                    <ul>
                        {node
                            .with(|n| n.seats.clone())
                            .into_iter()
                            .map(|s| view! { <HeldSeatItem s /> })
                            .collect_view()}
                    </ul>
                }
            })
        }
    };
    let seat_count = move || {
        let n = node.with(|n| n.seats.len());
        format!("{n} seat{}", if n == 1 { "" } else { "s" })
    };
    view! {
        <tr
            data-node=move || node.with(|n| n.node_id.clone())
            data-status=status
            class:stale=move || last().is_some()
        >
            <td data-label="Node">
                <a class="node-link" href=move || node.with(|n| format!("/nodes/{}", n.node_id))>
                    <strong>{move || node.with(|n| n.node_id.clone())}</strong>
                </a>
                <div class="muted small mono">{move || node.with(|n| n.incarnation.clone())}</div>
            </td>
            <td data-label="Status">
                <span class=move || format!("badge badge-{}", status())>{status}</span>
                {move || {
                    last().map(|l| {
                        let at = stale_as_of.get().unwrap_or_default();
                        view! {
                            <div class="muted small stale-note">
                                {format!("{l} as of ")}
                                <crate::components::time::When at=at.clone() />
                            </div>
                        }
                    })
                }}
            </td>
            <td data-label="Roles"><span>{move || node.with(|n| list(&n.roles))}</span></td>
            <td data-label="Labels"><span>{move || node.with(|n| list(&n.labels))}</span></td>
            <td data-label="Protocol"><span>{move || node.with(|n| n.protocol)}</span></td>
            <td data-label="Presence"><div><NodePresence node read_at ticks /></div></td>
            <td data-label="Seats">
                <details class="seats" prop:open=is_open on:toggle=on_toggle>
                    <summary>{seat_count}</summary>
                    {seat_list}
                </details>
            </td>
        </tr>
    }
}
