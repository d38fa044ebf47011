//! Events: the fleet's events, newest on top — first the ones the node
//! kept (so a reload loses nothing), then live from the node's event
//! stream, picking up right after the newest kept one. Filters (type,
//! seat, node, turn, and whether per-pass noise such as `seat_sweep` is
//! shown) live in the address, so a filtered view can be reloaded and
//! shared; a seat, node or turn in a row is a link to that filter. Rows
//! are coloured by how loud the event is and open to their fields. Reading
//! can be paused to study the screen while new events are held. The page
//! keeps the last [`MAX_ENTRIES`] live events besides the kept page.

use std::collections::VecDeque;

use leptos::prelude::*;
use leptos_router::hooks::{use_navigate, use_query_map};

use crate::api::{KeptEvent, NOISE};
use crate::components::notice::ErrorNotice;
use crate::fns::event_history;
use crate::live::{Connection, EVENT_NAMES, LiveBadge, LiveEvent, RESYNC, use_event_stream_after};
use crate::view::severity;

/// Live entries the page keeps (and holds while reading is paused).
pub const MAX_ENTRIES: usize = 500;

#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    id: u64,
    name: String,
    at: String,
    node: String,
    seat: String,
    turn: String,
    detail: String,
    /// The event's fields, one per line.
    fields: String,
}

impl Entry {
    fn parse(id: u64, name: String, data: &str) -> Entry {
        let value: serde_json::Value = serde_json::from_str(data).unwrap_or_default();
        let text = |k: &str| {
            value
                .get(k)
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string()
        };
        let (detail, fields) = match value.as_object() {
            Some(map) => {
                let shown: Vec<String> = map
                    .iter()
                    .filter(|(k, _)| {
                        !matches!(
                            k.as_str(),
                            "event" | "node" | "incarnation" | "at" | "seat" | "turn_id"
                        )
                    })
                    .map(|(k, v)| match v {
                        serde_json::Value::String(s) => format!("{k}={s}"),
                        other => format!("{k}={other}"),
                    })
                    .collect();
                let fields = serde_json::to_string_pretty(&value).unwrap_or_default();
                (crate::view::clipped(&shown.join(" · "), 240), fields)
            }
            None => (data.to_string(), data.to_string()),
        };
        Entry {
            id,
            at: text("at"),
            node: text("node"),
            seat: text("seat"),
            turn: text("turn_id"),
            name,
            detail,
            fields,
        }
    }

    fn of_live(e: LiveEvent) -> Entry {
        Entry::parse(e.id.parse().unwrap_or(0), e.name, &e.data)
    }

    fn of_kept(e: &KeptEvent) -> Entry {
        Entry::parse(e.id, e.name.clone(), &e.data)
    }
}

/// The page's filters, as the address carries them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Filters {
    kind: String,
    seat: String,
    node: String,
    turn: String,
    noise: bool,
}

impl Filters {
    fn href(&self) -> String {
        let noise = if self.noise { "1" } else { "" };
        super::page_href(
            "/events",
            &[
                ("type", &self.kind),
                ("seat", &self.seat),
                ("node", &self.node),
                ("turn", &self.turn),
                ("noise", noise),
            ],
            1,
        )
    }

    /// Whether a live entry passes (the kept page is filtered by the node).
    fn passes(&self, e: &Entry) -> bool {
        (self.kind.is_empty() || e.name == self.kind)
            && (self.seat.is_empty() || e.seat == self.seat)
            && (self.node.is_empty() || e.node == self.node)
            && (self.turn.is_empty() || e.turn == self.turn)
            && (self.noise || !self.kind.is_empty() || !NOISE.contains(&e.name.as_str()))
    }
}

#[component]
pub fn EventsPage() -> impl IntoView {
    let query = use_query_map();
    let filters = Memo::new(move |_| {
        query.with(|q| Filters {
            kind: q.get("type").unwrap_or_default(),
            seat: q.get("seat").unwrap_or_default(),
            node: q.get("node").unwrap_or_default(),
            turn: q.get("turn").unwrap_or_default(),
            noise: q.get("noise").is_some_and(|v| v == "1"),
        })
    });
    let kept = Resource::new(
        move || filters.get(),
        |f| event_history(None, f.seat, f.node, f.turn, f.kind, f.noise),
    );
    // Live, newest first.
    let entries = RwSignal::new(VecDeque::<Entry>::new());
    // Arrived while reading was paused, oldest first.
    let held = RwSignal::new(VecDeque::<Entry>::new());
    let reading = RwSignal::new(true);

    let state: ReadSignal<Connection> = use_event_stream_after(
        EVENT_NAMES,
        move || kept.get_untracked().and_then(|r| r.ok()).map(|p| p.newest),
        move |e| {
            let entry = Entry::of_live(e);
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

    let toggle = Callback::new(move |_: ()| {
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
    });

    view! {
        <section class="page">
            <div class="page-head">
                <leptos_meta::Title text="Events" />
                <h1>"Events"</h1>
                <LiveBadge state=state />
            </div>
            <EventFilters filters reading held toggle />
            <Transition fallback=|| view! { <p class="muted">"Reading the kept events…"</p> }>
                {move || kept.get().and_then(|r| r.err()).map(|e| view! { <ErrorNotice error=e /> })}
                <EventTable kept entries filters reading />
            </Transition>
        </section>
    }
}

/// The events shown: the live entries that pass the filters, then the kept
/// page below the newest of them. Drawn inside the page's loading boundary,
/// where its read of the kept page waits with the rest of the page.
#[component]
fn EventTable(
    kept: Resource<Result<crate::api::EventPage, crate::error::AppError>>,
    entries: RwSignal<VecDeque<Entry>>,
    filters: Memo<Filters>,
    reading: RwSignal<bool>,
) -> impl IntoView {
    // The live entries that pass, then the kept page below the newest of
    // them (an event is shown once, whichever way it came).
    let shown = Memo::new(move |_| {
        let f = filters.get();
        let mut out: Vec<Entry> =
            entries.with(|v| v.iter().filter(|e| f.passes(e)).cloned().collect());
        let floor = out.last().map_or(u64::MAX, |e| e.id);
        if let Some(Ok(page)) = kept.get() {
            out.extend(
                page.events
                    .iter()
                    .filter(|e| e.id < floor)
                    .map(Entry::of_kept),
            );
        }
        out
    });

    view! {
            <p class="muted small">
                {move || {
                    let paused = if reading.get() { "" } else { " · reading paused: new events are held" };
                    let more = kept.get().and_then(|r| r.ok()).is_some_and(|p| p.more);
                    format!(
                        "{} event{} shown: the node's kept events{}, then live{paused}",
                        shown.with(|s| s.len()),
                        if shown.with(|s| s.len()) == 1 { "" } else { "s" },
                        if more { " (the newest page; older ones are kept too)" } else { "" },
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
                        <For each=move || shown.get() key=|e| format!("{}:{}", e.id, e.name) let:e>
                            <EventRow e=e filters=filters />
                        </For>
                    </tbody>
                </table>
            </div>
            {move || {
                shown
                    .with(|v| v.is_empty())
                    .then(|| view! { <p class="muted">"No events yet: they appear here as they happen."</p> })
            }}
    }
}

/// The filter bar: type, seat, node, the per-pass switch and the reading
/// pause, each filter a change of the address.
#[component]
fn EventFilters(
    filters: Memo<Filters>,
    reading: RwSignal<bool>,
    held: RwSignal<VecDeque<Entry>>,
    toggle: Callback<()>,
) -> impl IntoView {
    let navigate = use_navigate();
    let set = move |change: &dyn Fn(&mut Filters)| {
        let mut f = filters.get_untracked();
        change(&mut f);
        navigate(
            &f.href(),
            leptos_router::NavigateOptions {
                replace: true,
                scroll: false,
                ..Default::default()
            },
        );
    };
    let set_kind = set.clone();
    let set_seat = set.clone();
    let set_node = set.clone();
    let set_noise = set;
    view! {
            <div class="filters" role="search">
                <label for="event-type">"Type"</label>
                <select
                    id="event-type"
                    on:change=move |ev| {
                        let v = event_target_value(&ev);
                        set_kind(&move |f: &mut Filters| f.kind = v.clone());
                    }
                >
                    <option value="" selected=move || filters.with(|f| f.kind.is_empty())>"any"</option>
                    {EVENT_NAMES
                        .iter()
                        .chain([&RESYNC])
                        .map(|n| view! { <option value=*n selected=move || filters.with(|f| f.kind == *n)>{*n}</option> })
                        .collect_view()}
                </select>
                <label for="event-seat">"Seat"</label>
                <input
                    id="event-seat"
                    type="search"
                    placeholder="handle"
                    maxlength="200"
                    prop:value=move || filters.with(|f| f.seat.clone())
                    on:change=move |ev| {
                        let v = event_target_value(&ev).trim().to_string();
                        set_seat(&move |f: &mut Filters| f.seat = v.clone());
                    }
                />
                <label for="event-node">"Node"</label>
                <input
                    id="event-node"
                    type="search"
                    placeholder="node id"
                    maxlength="200"
                    prop:value=move || filters.with(|f| f.node.clone())
                    on:change=move |ev| {
                        let v = event_target_value(&ev).trim().to_string();
                        set_node(&move |f: &mut Filters| f.node = v.clone());
                    }
                />
                <label class="check">
                    <input
                        type="checkbox"
                        id="event-noise"
                        prop:checked=move || filters.with(|f| f.noise)
                        on:change=move |ev| {
                            let on = event_target_checked(&ev);
                            set_noise(&move |f: &mut Filters| f.noise = on);
                        }
                    />
                    " per-pass events (seat_sweep …)"
                </label>
                <button type="button" class="reading" aria-pressed=move || (!reading.get()).to_string() on:click=move |_| toggle.run(())>
                    {move || {
                        if reading.get() {
                            "Pause reading".to_string()
                        } else {
                            let n = held.with(|h| h.len());
                            format!("Resume reading ({n} new)")
                        }
                    }}
                </button>
                {move || {
                    filters
                        .with(|f| !f.turn.is_empty())
                        .then(|| view! { <a class="small" href=move || Filters { turn: String::new(), ..filters.get() }.href()>{move || format!("turn {} ×", filters.with(|f| f.turn.clone()))}</a> })
                }}
            </div>
    }
}

/// The page's address with one filter set to `value` (a row's node, seat
/// or turn as a link).
fn filter_href(
    filters: Memo<Filters>,
    value: String,
    set: fn(&mut Filters, String),
) -> impl Fn() -> String + Clone + Send + Sync + 'static {
    move || {
        let mut f = filters.get();
        set(&mut f, value.clone());
        f.href()
    }
}

#[component]
fn EventRow(e: Entry, filters: Memo<Filters>) -> impl IntoView {
    let sev = severity(&e.name).as_str();
    let node_href = filter_href(filters, e.node.clone(), |f, v| f.node = v);
    let seat_href = filter_href(filters, e.seat.clone(), |f, v| f.seat = v);
    let turn_href = filter_href(filters, e.turn.clone(), |f, v| f.turn = v);
    view! {
        <tr data-event=e.name.clone() data-id=e.id class=format!("sev-{sev}")>
            <td class="mono small" data-label="When">
                <crate::components::time::When at=e.at.clone() />
            </td>
            <td class="mono" data-label="Event">{e.name.clone()}</td>
            <td data-label="Node">
                {(!e.node.is_empty()).then(|| view! { <a class="filter-link" href=node_href>{e.node.clone()}</a> })}
            </td>
            <td class="mono" data-label="Seat">
                {(!e.seat.is_empty()).then(|| view! { <a class="filter-link" href=seat_href>{e.seat.clone()}</a> })}
            </td>
            <td class="small detail" data-label="Details">
                <details>
                    <summary>
                        {e.detail.clone()}
                        {(!e.turn.is_empty()).then(|| view! { " · " <a class="filter-link mono" href=turn_href>{format!("turn {}", crate::view::clipped(&e.turn, 8))}</a> })}
                    </summary>
                    <pre class="fields">{e.fields.clone()}</pre>
                </details>
            </td>
        </tr>
    }
}
