//! Settings › Nodes' strips: every live node's last hour, minute by
//! minute, as each node kept its own — the seats it held, the turns it
//! finished and its coordination store's p99 — read again every minute.
//! A node that does not answer is named with why.

use leptos::prelude::*;

use crate::api::{FleetTrends, NodeTrend};
use crate::components::chart::{BarChart, LineChart};
use crate::components::notice::ErrorNotice;
use crate::fns::node_trends;
use crate::view::strip_words;

const W: f64 = 240.0;
const H: f64 = 32.0;

#[component]
pub fn NodeStrips() -> impl IntoView {
    let data = Resource::new(|| (), |_| node_trends());
    Effect::new(move |_| {
        if let Ok(h) =
            set_interval_with_handle(move || data.refetch(), std::time::Duration::from_secs(60))
        {
            on_cleanup(move || h.clear());
        }
    });
    view! {
        <section class="node-strips" aria-labelledby="strips-h">
            <h2 id="strips-h">"The last hour, per node"</h2>
            <Transition fallback=|| view! { <p class="muted">"Asking every node for its last hour…"</p> }>
                {move || {
                    data.get()
                        .map(|r| match r {
                            Ok(t) => view! { <Strips trends=t /> }.into_any(),
                            Err(e) => view! { <ErrorNotice error=e /> }.into_any(),
                        })
                }}
            </Transition>
        </section>
    }
}

#[component]
fn Strips(trends: FleetTrends) -> impl IntoView {
    view! {
        <p class="muted small">
            {format!(
                "Seats held, turns finished and the coordination store's p99, a minute a mark, up to {} UTC; each node keeps its own hour in memory.",
                trends.to
            )}
        </p>
        {trends.roster_error.map(|e| view! { <p class="notice notice-warn">{e}</p> })}
        <ul class="strips">
            {trends.nodes.into_iter().map(|n| view! { <Strip node=n /> }).collect_view()}
        </ul>
    }
}

#[component]
fn Strip(node: NodeTrend) -> impl IntoView {
    let words = strip_words(&node.minutes);
    let held: Vec<Option<u64>> = node.minutes.iter().map(|m| m.seats_held).collect();
    let turns: Vec<u64> = node.minutes.iter().map(|m| m.turns).collect();
    let p99: Vec<Option<u64>> = node.minutes.iter().map(|m| m.store_p99_us).collect();
    let href = format!("/nodes/{}", crate::pages::encode(&node.node_id));
    view! {
        <li class="strip" data-node=node.node_id.clone() data-turns=words.turns_total>
            <div class="strip-head">
                <a href=href>{node.node_id.clone()}</a>
                {node.error.clone().map(|e| view! { <span class="notice notice-warn small">{format!(" its hour cannot be had: {e}")}</span> })}
            </div>
            <div class="strip-charts">
                <figure>
                    <LineChart values=held width=W height=H class="strip-chart" dot=1.5 label="Seats held per minute over the last hour" />
                    <figcaption class="muted small">{words.held}</figcaption>
                </figure>
                <figure>
                    <BarChart values=turns width=W height=H class="strip-chart" label="Turns finished per minute over the last hour" />
                    <figcaption class="muted small">{words.turns}</figcaption>
                </figure>
                <figure>
                    <LineChart values=p99 width=W height=H class="strip-chart" dot=1.5 label="Coordination store p99 per minute over the last hour" />
                    <figcaption class="muted small">{words.store}</figcaption>
                </figure>
            </div>
        </li>
    }
}
