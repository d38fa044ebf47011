//! One seat's page (`/seats/{handle}`): the seat as the Seats page shows
//! it, with its actions; a box to send it a message (operators); what it
//! said and did (its outbox); and its timeline — its turns, pauses, moves
//! and errors from the events the node kept, merged with people's actions
//! on it from the audit log — read from the node (so it shows what
//! happened before the page was opened) and read again live as the seat's
//! events arrive. Older timeline pages are asked for with `?before=`.

use leptos::prelude::*;
use leptos_router::hooks::{use_params_map, use_query_map};

use crate::api::{ActivityMinute, EffectView, InboxMinute, SeatDetail};
use crate::components::chart::{BarChart, LineChart};
use crate::components::notice::ErrorNotice;
use crate::error::AppError;
use crate::fns::{seat_page, send_message, whoami};
use crate::live::{EVENT_NAMES, LiveBadge, refetch_on};
use crate::view::{TimelineItem, inbox_words, timeline};

#[component]
pub fn SeatPage() -> impl IntoView {
    let params = use_params_map();
    let query = use_query_map();
    let handle = Signal::derive(move || params.with(|p| p.get("handle").unwrap_or_default()));
    let before =
        Signal::derive(move || query.with(|q| q.get("before").and_then(|b| b.parse::<u64>().ok())));
    let detail = Resource::new(
        move || (handle.get(), before.get()),
        |(h, b)| seat_page(h, b),
    );
    // Its dead letters are read again with the rest of the page.
    let reads = RwSignal::new(0u64);
    let live = refetch_on(
        EVENT_NAMES,
        move |e| e.seat().is_some_and(|s| s == handle.get_untracked()),
        move || {
            detail.refetch();
            reads.update(|n| *n += 1);
        },
    );
    let me = Resource::new(|| (), |_| whoami());
    let operator = Signal::derive(move || {
        me.get()
            .and_then(|r| r.ok())
            .is_some_and(|p| p.is_operator())
    });
    view! {
        <section class="page seat-page">
            <div class="page-head">
                <leptos_meta::Title text=move || format!("{} · Seats", handle.get()) />
                <h1>"Seat " <span class="mono">{move || handle.get()}</span></h1>
                <LiveBadge state=live />
            </div>
            <p class="muted small">
                <a href=move || format!("/memory?seat={}", handle.get())>"Its memory"</a>
                " · "
                <a href=move || format!("/events?seat={}", handle.get())>"Its events"</a>
                " · "
                <a href="/seats">"All seats"</a>
            </p>
            {move || {
                let h = handle.get();
                view! { <crate::pages::seats::SeatControls handle=h /> }
            }}
            // Who may write is read with the page (inside its loading boundary).
            <Suspense fallback=|| ()>
                <MessageBox operator handle refetch=Callback::new(move |_| detail.refetch()) />
            </Suspense>
            <Transition fallback=|| view! { <p class="muted">"Reading the seat…"</p> }>
                {move || {
                    detail
                        .get()
                        .map(|r| match r {
                            Ok(d) => view! { <SeatStory detail=d handle=handle /> }.into_any(),
                            Err(e) => view! { <ErrorNotice error=e /> }.into_any(),
                        })
                }}
            </Transition>
            <section class="seat-dead-letters" aria-labelledby="seat-dl-h">
                <h2 id="seat-dl-h">"Dead letters"</h2>
                <crate::pages::dead_letters::DeadLetters seat=handle refresh=Signal::from(reads) />
            </section>
        </section>
    }
}

/// The seat's outbox and timeline.
#[component]
fn SeatStory(detail: SeatDetail, handle: Signal<String>) -> impl IntoView {
    let items = timeline(&detail.timeline.events, &detail.actions);
    let older = detail
        .timeline
        .more
        .then(|| detail.timeline.events.last().map(|e| e.id))
        .flatten();
    view! {
        <LastHour minutes=detail.activity.clone() to=detail.activity_to.clone() inbox=detail.inbox.clone() inbox_error=detail.inbox_error.clone() />
        <section class="outbox" aria-labelledby="outbox-h">
            <h2 id="outbox-h">"What it said"</h2>
            {detail.outbox_error.clone().map(|e| view! { <p class="notice notice-warn">{format!("The outbox cannot be read: {e}")}</p> })}
            {detail
                .outbox
                .is_empty()
                .then(|| view! { <p class="muted">"Nothing yet: its replies appear here."</p> })}
            <ol class="effects">
                {detail.outbox.into_iter().map(|e| view! { <EffectItem e /> }).collect_view()}
            </ol>
        </section>
        <section class="timeline" aria-labelledby="timeline-h">
            <h2 id="timeline-h">"Timeline"</h2>
            {items
                .is_empty()
                .then(|| view! { <p class="muted">"Nothing kept about this seat yet."</p> })}
            <ol class="timeline-items">
                {items.into_iter().map(|i| view! { <TimelineLine i /> }).collect_view()}
            </ol>
            {older.map(|id| {
                view! {
                    <a class="older" href=format!("/seats/{}?before={id}", handle.get_untracked())>
                        "Older"
                    </a>
                }
            })}
        </section>
    }
}

/// The seat's last hour: turns per minute (bars), their mean duration
/// (a line) and its inbox depth as its holder sampled it (a line), with
/// the totals in words.
#[component]
fn LastHour(
    minutes: Vec<ActivityMinute>,
    to: String,
    inbox: Vec<InboxMinute>,
    inbox_error: Option<String>,
) -> impl IntoView {
    const W: f64 = 600.0;
    const H: f64 = 60.0;
    let turns: Vec<u64> = minutes.iter().map(|m| m.turns).collect();
    let total: u64 = turns.iter().sum();
    let busiest = turns.iter().copied().max().unwrap_or(0);
    let durations: Vec<Option<u64>> = minutes
        .iter()
        .map(|m| (m.turns > 0).then_some(m.mean_ms))
        .collect();
    let mean = minutes
        .iter()
        .map(|m| m.turns * m.mean_ms)
        .sum::<u64>()
        .checked_div(total)
        .unwrap_or(0);
    let summary = if total == 0 {
        "No turn finished in the last hour.".to_string()
    } else {
        format!(
            "{total} turn{} in the last hour (at most {busiest} a minute), {} on average.",
            if total == 1 { "" } else { "s" },
            crate::view::ms_words(mean)
        )
    };
    let depths: Vec<Option<u64>> = inbox.iter().map(|m| m.depth).collect();
    let inbox_deepest = depths.iter().flatten().max().copied().unwrap_or(0);
    let inbox_said = match inbox_error {
        Some(e) => e,
        None => inbox_words(&inbox),
    };
    view! {
        <section class="last-hour" aria-labelledby="last-hour-h" data-turns=total>
            <h2 id="last-hour-h">"The last hour"</h2>
            <p class="muted small">{summary}{format!(" Up to {to} UTC.")}</p>
            <figure>
                <BarChart values=turns width=W height=H label="Turns finished per minute over the last hour" />
                <figcaption class="muted small">"Turns per minute"</figcaption>
            </figure>
            <figure>
                <LineChart values=durations width=W height=H label="Mean turn duration per minute over the last hour" />
                <figcaption class="muted small">"Mean turn duration"</figcaption>
            </figure>
            <figure class="inbox-depth" data-deepest=inbox_deepest>
                <LineChart values=depths width=W height=H label="Inbox depth per minute over the last hour" />
                <figcaption class="muted small">{format!("Inbox depth: {inbox_said}")}</figcaption>
            </figure>
        </section>
    }
}

#[component]
fn EffectItem(e: EffectView) -> impl IntoView {
    let at = e.at.clone().unwrap_or_default();
    let said = e.text.clone().unwrap_or_else(|| e.body.clone());
    view! {
        <li class="effect" data-turn=e.turn_id.clone() data-kind=e.kind.clone()>
            <div class="muted small">
                <crate::components::time::When at=at.clone() />
                {format!(" · {} · answering {} · on {}", e.kind, e.trigger_ids.join(", "), e.node)}
            </div>
            <p class="said">{said}</p>
        </li>
    }
}

#[component]
fn TimelineLine(i: TimelineItem) -> impl IntoView {
    let at = i.at.clone();
    view! {
        <li class=format!("tl tl-{} sev-{}", i.kind, i.severity.as_str()) data-kind=i.kind data-title=i.title.clone()>
            <span class="mono small"><crate::components::time::When at=at.clone() /></span>
            <span class="tl-title">{i.title.clone()}</span>
            <span class="muted small tl-detail">{i.detail.clone()}</span>
            {(!i.node.is_empty()).then(|| view! { <span class="muted small">{format!(" · {}", i.node)}</span> })}
        </li>
    }
}

/// An operator's message to the seat: sent to its inbox as a
/// `task_assigned` from the person; the seat's answer appears in "What it
/// said" as it comes.
#[component]
fn MessageBox(
    operator: Signal<bool>,
    handle: Signal<String>,
    refetch: Callback<()>,
) -> impl IntoView {
    let text = RwSignal::new(String::new());
    let send: Action<(String, String), Result<String, AppError>> =
        Action::new(|(h, t): &(String, String)| send_message(h.clone(), t.clone()));
    Effect::new(move |prev: Option<usize>| {
        let v = send.version().get();
        if prev.is_some_and(|p| p != v) {
            if matches!(send.value().get_untracked(), Some(Ok(_))) {
                text.set(String::new());
            }
            refetch.run(());
        }
        v
    });
    view! {
        <form
            class="message-box"
            on:submit=move |ev| {
                ev.prevent_default();
                send.dispatch((handle.get_untracked(), text.get_untracked()));
            }
        >
            <label for="seat-message">"Send the seat a message"</label>
            <textarea
                id="seat-message"
                rows="2"
                maxlength="4000"
                placeholder=move || if operator.get() { "Write to the agent…" } else { "Only operators send messages." }
                disabled=move || !operator.get()
                prop:value=move || text.get()
                on:input=move |ev| text.set(event_target_value(&ev))
            ></textarea>
            <button type="submit" disabled=move || !operator.get() || send.pending().get()>
                "Send"
            </button>
            {move || {
                send.value().get().map(|r| match r {
                    Ok(id) => view! {
                        <p class="notice notice-info" role="status" data-sent=id.clone()>
                            {format!("Sent ({id}). Its answer appears under What it said.")}
                        </p>
                    }
                    .into_any(),
                    Err(e) => view! { <ErrorNotice error=e /> }.into_any(),
                })
            }}
        </form>
    }
}
