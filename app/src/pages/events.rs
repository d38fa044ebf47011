//! Events: the fleet's events as they happen, newest on top, read from the
//! node's event stream. Filter by type, seat and node (in the browser);
//! pause reading to study what is on screen while new events are held.
//! The page keeps the last [`MAX_ENTRIES`].

use std::collections::VecDeque;

use leptos::prelude::*;

use crate::live::{Connection, EVENT_NAMES, LiveBadge, LiveEvent, RESYNC, use_event_stream};

/// Entries the page keeps (and holds while reading is paused).
pub const MAX_ENTRIES: usize = 500;

#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    key: String,
    name: String,
    at: String,
    node: String,
    seat: String,
    detail: String,
}

impl Entry {
    fn of(e: LiveEvent) -> Entry {
        let value: serde_json::Value = serde_json::from_str(&e.data).unwrap_or_default();
        let text = |k: &str| {
            value
                .get(k)
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string()
        };
        let detail = match value.as_object() {
            Some(map) => map
                .iter()
                .filter(|(k, _)| {
                    !matches!(k.as_str(), "event" | "node" | "incarnation" | "at" | "seat")
                })
                .map(|(k, v)| match v {
                    serde_json::Value::String(s) => format!("{k}={s}"),
                    other => format!("{k}={other}"),
                })
                .collect::<Vec<_>>()
                .join(" · "),
            None => e.data.clone(),
        };
        Entry {
            key: format!("{}:{}", e.id, e.name),
            at: text("at"),
            node: text("node"),
            seat: text("seat"),
            name: e.name,
            detail,
        }
    }

    fn time(&self) -> String {
        self.at.get(11..19).unwrap_or(&self.at).to_string()
    }
}

#[component]
pub fn EventsPage() -> impl IntoView {
    // Newest first.
    let entries = RwSignal::new(VecDeque::<Entry>::new());
    // Arrived while reading was paused, oldest first.
    let held = RwSignal::new(VecDeque::<Entry>::new());
    let reading = RwSignal::new(true);
    let kind = RwSignal::new(String::new());
    let seat = RwSignal::new(String::new());
    let node = RwSignal::new(String::new());

    let state: ReadSignal<Connection> = use_event_stream(
        EVENT_NAMES,
        move |e| {
            let entry = Entry::of(e);
            if reading.get_untracked() {
                entries.update(|v| {
                    v.push_front(entry);
                    v.truncate(MAX_ENTRIES);
                });
            } else {
                held.update(|h| {
                    h.push_back(entry);
                    while h.len() > MAX_ENTRIES {
                        h.pop_front();
                    }
                });
            }
        },
        || {},
    );

    let toggle = move |_| {
        if reading.get_untracked() {
            reading.set(false);
        } else {
            let mut arrived = held.try_update(std::mem::take).unwrap_or_default();
            entries.update(|v| {
                while let Some(e) = arrived.pop_front() {
                    v.push_front(e);
                }
                v.truncate(MAX_ENTRIES);
            });
            reading.set(true);
        }
    };

    let shown = Memo::new(move |_| {
        let kind = kind.get();
        let seat = seat.get().trim().to_lowercase();
        let node = node.get().trim().to_lowercase();
        entries.with(|v| {
            v.iter()
                .filter(|e| kind.is_empty() || e.name == kind)
                .filter(|e| seat.is_empty() || e.seat.to_lowercase().contains(&seat))
                .filter(|e| node.is_empty() || e.node.to_lowercase().contains(&node))
                .cloned()
                .collect::<Vec<_>>()
        })
    });

    view! {
        <section class="page">
            <div class="page-head">
                <h1>"Events"</h1>
                <LiveBadge state=state />
            </div>
            <div class="filters" role="search">
                <label for="event-type">"Type"</label>
                <select id="event-type" on:change=move |ev| kind.set(event_target_value(&ev))>
                    <option value="">"any"</option>
                    {EVENT_NAMES
                        .iter()
                        .chain([&RESYNC])
                        .map(|n| view! { <option value=*n>{*n}</option> })
                        .collect_view()}
                </select>
                <label for="event-seat">"Seat"</label>
                <input id="event-seat" type="search" placeholder="handle" bind:value=seat />
                <label for="event-node">"Node"</label>
                <input id="event-node" type="search" placeholder="node id" bind:value=node />
                <button type="button" class="reading" aria-pressed=move || (!reading.get()).to_string() on:click=toggle>
                    {move || {
                        if reading.get() {
                            "Pause reading".to_string()
                        } else {
                            let n = held.with(|h| h.len());
                            format!("Resume reading ({n} new)")
                        }
                    }}
                </button>
            </div>
            <p class="muted small">
                {move || {
                    let total = entries.with(|v| v.len());
                    let paused = if reading.get() { "" } else { " · reading paused: new events are held" };
                    format!(
                        "{} of the last {} event{} shown (the page keeps {MAX_ENTRIES}){paused}",
                        shown.with(|s| s.len()),
                        total,
                        if total == 1 { "" } else { "s" },
                    )
                }}
            </p>
            <div class="table-wrap">
                <table class="events stack-table">
                    <thead>
                        <tr>
                            <th scope="col">"When"</th>
                            <th scope="col">"Event"</th>
                            <th scope="col">"Node"</th>
                            <th scope="col">"Seat"</th>
                            <th scope="col">"Details"</th>
                        </tr>
                    </thead>
                    <tbody>
                        <For each=move || shown.get() key=|e| e.key.clone() let:e>
                            <tr data-event=e.name.clone()>
                                <td class="mono small" data-label="When">
                                    <time datetime=e.at.clone() title=e.at.clone()>{e.time()}</time>
                                </td>
                                <td class="mono" data-label="Event">{e.name.clone()}</td>
                                <td data-label="Node">{e.node.clone()}</td>
                                <td class="mono" data-label="Seat">{e.seat.clone()}</td>
                                <td class="small detail" data-label="Details">{e.detail.clone()}</td>
                            </tr>
                        </For>
                    </tbody>
                </table>
            </div>
            {move || {
                entries
                    .with(|v| v.is_empty())
                    .then(|| view! { <p class="muted">"Waiting for events: they appear here as they happen."</p> })
            }}
        </section>
    }
}
