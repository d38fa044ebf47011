//! One node's page (`/nodes/{id}`): its status, presence, protocol,
//! version, roles and labels as the roster reads them, the seats it holds
//! (each linked to its page), and its recent events from those the node
//! kept — read again live as the fleet changes. A node that is not in the
//! roster (stopped, or never seen) is said to be so.

use leptos::prelude::*;
use leptos_router::hooks::use_params_map;

use crate::api::{FleetView, KeptEvent, NodeView};
use crate::components::notice::ErrorNotice;
use crate::fns::{event_history, fleet};
use crate::live::{EVENT_NAMES, LiveBadge, refetch_on};
use crate::view::severity;

/// How many of the node's events the page lists.
pub const NODE_EVENTS_SHOWN: usize = 30;

#[component]
pub fn NodePage() -> impl IntoView {
    let params = use_params_map();
    let id = Signal::derive(move || params.with(|p| p.get("id").unwrap_or_default()));
    let roster = Resource::new(|| (), |_| fleet());
    let events = Resource::new(
        move || id.get(),
        |node| {
            event_history(
                None,
                String::new(),
                node,
                String::new(),
                String::new(),
                false,
            )
        },
    );
    // Read again as the node's own events arrive.
    let live = refetch_on(
        EVENT_NAMES,
        move |e| e.node().is_some_and(|n| n == id.get_untracked()),
        move || {
            roster.refetch();
            events.refetch();
        },
    );
    view! {
        <section class="page node-page">
            <div class="page-head">
                <leptos_meta::Title text=move || format!("{} · Nodes", id.get()) />
                <h1>"Node " <span class="mono">{move || id.get()}</span></h1>
                <LiveBadge state=live />
            </div>
            <p class="muted small">
                <a href=move || format!("/events?node={}", id.get())>"All its events"</a>
                " · "
                <a href="/settings/nodes">"All nodes"</a>
            </p>
            <Transition fallback=|| view! { <p class="muted">"Reading the roster…"</p> }>
                {move || {
                    roster
                        .get()
                        .map(|r| match r {
                            Ok(f) => view! { <NodeFacts fleet=f id=id.get_untracked() /> }.into_any(),
                            Err(e) => view! { <ErrorNotice error=e /> }.into_any(),
                        })
                }}
            </Transition>
            <section aria-labelledby="node-events-h">
                <h2 id="node-events-h">"Recent events"</h2>
                <Transition fallback=|| view! { <p class="muted">"Reading its events…"</p> }>
                    {move || {
                        events
                            .get()
                            .map(|r| match r {
                                Ok(p) => view! { <NodeEvents events=p.events /> }.into_any(),
                                Err(e) => view! { <ErrorNotice error=e /> }.into_any(),
                            })
                    }}
                </Transition>
            </section>
        </section>
    }
}

#[component]
fn NodeFacts(fleet: FleetView, id: String) -> impl IntoView {
    let Some(n) = fleet.nodes.iter().find(|n| n.node_id == id).cloned() else {
        return view! {
            <p class="notice notice-warn" role="status" data-node-absent=id.clone()>
                {format!(
                    "Node {id} is not in the fleet's roster: it stopped, its presence lapsed, or it never ran. Its events below are those this node kept."
                )}
            </p>
        }
        .into_any();
    };
    view! { <NodeCard n stale=fleet.stale.clone() /> }.into_any()
}

#[component]
fn NodeCard(n: NodeView, stale: Option<String>) -> impl IntoView {
    let status = n.status.as_str();
    let list = |v: &[String]| {
        if v.is_empty() {
            "—".to_string()
        } else {
            v.join(", ")
        }
    };
    let held = n.seats.len();
    view! {
        {stale.map(|why| view! { <p class="notice notice-warn" role="status">{format!("The roster cannot be read right now ({why}): this is the last read.")}</p> })}
        <dl class="facts" data-node=n.node_id.clone() data-status=status>
            <dt>"Status"</dt>
            <dd><span class=format!("badge badge-{status}")>{status}</span></dd>
            <dt>"Incarnation"</dt>
            <dd class="mono small">{n.incarnation.clone()}</dd>
            <dt>"Version"</dt>
            <dd>{format!("{} (protocol {})", n.version, n.protocol)}</dd>
            <dt>"Roles"</dt>
            <dd>{list(&n.roles)}</dd>
            <dt>"Labels"</dt>
            <dd>{list(&n.labels)}</dd>
            <dt>"Presence"</dt>
            <dd>
                {match n.presence_expires_at.clone() {
                    Some(at) => view! { "expires " <crate::components::time::When at=at.clone() /> }.into_any(),
                    None => view! { "no lease (a single node)" }.into_any(),
                }}
            </dd>
        </dl>
        <h2>{format!("Seats it holds ({held})")}</h2>
        {(held == 0).then(|| view! { <p class="muted">"None."</p> })}
        <ul class="held-seats">
            {n
                .seats
                .into_iter()
                .map(|s| view! { <crate::pages::nodes::HeldSeatItem s /> })
                .collect_view()}
        </ul>
    }
    .into_any()
}

#[component]
fn NodeEvents(events: Vec<KeptEvent>) -> impl IntoView {
    let none = events.is_empty();
    view! {
        {none.then(|| view! { <p class="muted">"None kept."</p> })}
        <ol class="node-events">
            {events
                .into_iter()
                .take(NODE_EVENTS_SHOWN)
                .map(|e| {
                    let v: serde_json::Value = serde_json::from_str(&e.data).unwrap_or_default();
                    let text = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or_default().to_string();
                    let (at, seat) = (text("at"), text("seat"));
                    let sev = severity(&e.name).as_str();
                    view! {
                        <li class=format!("sev-{sev}") data-event=e.name.clone()>
                            <span class="mono small"><crate::components::time::When at=at.clone() /></span>
                            " "
                            <span class="mono">{e.name.clone()}</span>
                            {(!seat.is_empty()).then(|| view! { " · " <a class="mono seat-link" href=format!("/seats/{seat}")>{seat.clone()}</a> })}
                        </li>
                    }
                })
                .collect_view()}
        </ol>
    }
}
