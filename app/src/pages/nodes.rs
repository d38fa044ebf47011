//! Settings › Nodes, the home page: every live node of the fleet, its
//! status, roles, labels, protocol, presence and the seats it holds,
//! refreshed live from the event stream when a seat moves or a node comes
//! or goes.

use std::collections::BTreeSet;

use leptos::prelude::*;

use crate::api::{FleetView, NodeView};
use crate::components::notice::{ErrorNotice, InfoNotice};
use crate::fns::fleet;
use crate::live::{LiveBadge, NODE_EVENTS, refetch_on};

#[component]
pub fn NodesPage() -> impl IntoView {
    let data = Resource::new(|| (), |_| fleet());
    let live = refetch_on(NODE_EVENTS, |_| true, move || data.refetch());
    // Which nodes' seat lists are open, kept across refreshes.
    let open = RwSignal::new(BTreeSet::<String>::new());
    view! {
        <section class="page">
            <div class="page-head">
                <h1>"Settings › Nodes"</h1>
                <LiveBadge state=live />
            </div>
            <Transition fallback=|| view! { <p class="muted">"Reading the fleet…"</p> }>
                {move || {
                    data.get()
                        .map(|r| match r {
                            Ok(f) => view! { <Fleet fleet=f open=open /> }.into_any(),
                            Err(e) => view! { <ErrorNotice error=e /> }.into_any(),
                        })
                }}
            </Transition>
        </section>
    }
}

#[component]
fn Fleet(fleet: FleetView, open: RwSignal<BTreeSet<String>>) -> impl IntoView {
    let count = fleet.nodes.len();
    view! {
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
        <div class="table-wrap">
            <table class="nodes">
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
                    {fleet.nodes.into_iter().map(|n| view! { <NodeRow node=n open=open /> }).collect_view()}
                </tbody>
            </table>
        </div>
    }
}

#[component]
fn NodeRow(node: NodeView, open: RwSignal<BTreeSet<String>>) -> impl IntoView {
    let key = node.incarnation.clone();
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
    let status = node.status.as_str();
    let list = |v: &[String]| {
        if v.is_empty() {
            "—".to_string()
        } else {
            v.join(", ")
        }
    };
    view! {
        <tr data-node=node.node_id.clone()>
            <td>
                <strong>{node.node_id.clone()}</strong>
                <div class="muted small mono">{node.incarnation.clone()}</div>
            </td>
            <td><span class=format!("badge badge-{status}")>{status}</span></td>
            <td>{list(&node.roles)}</td>
            <td>{list(&node.labels)}</td>
            <td>{node.protocol}</td>
            <td>
                {match node.presence_expires_at.clone() {
                    Some(at) => {
                        let short = at.get(11..19).unwrap_or(&at).to_string();
                        view! {
                            "until "
                            <time datetime=at.clone() title=at>{short}</time>
                        }
                            .into_any()
                    }
                    None => view! { "no lease" }.into_any(),
                }}
            </td>
            <td>
                <details class="seats" prop:open=is_open on:toggle=on_toggle>
                    <summary>{format!("{} seat{}", node.seats.len(), if node.seats.len() == 1 { "" } else { "s" })}</summary>
                    <ul>
                        {node
                            .seats
                            .iter()
                            .map(|s| {
                                let since = s.since.clone();
                                let short = since.get(11..16).unwrap_or(&since).to_string();
                                view! {
                                    <li data-seat=s.handle.clone()>
                                        <span class="mono">{s.handle.clone()}</span>
                                        <span class="muted small">
                                            {format!(" · epoch {} · since ", s.epoch)}
                                            <time datetime=since.clone() title=since.clone()>{short}</time>
                                        </span>
                                    </li>
                                }
                            })
                            .collect_view()}
                    </ul>
                </details>
            </td>
        </tr>
    }
}
