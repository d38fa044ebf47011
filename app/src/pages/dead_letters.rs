//! Dead letters (`/dead-letters`, and a seat's own on its page): mail the
//! queue gave up on — delivered too often without success, or unreadable —
//! newest first, with why, how often and when; read again live as new ones
//! arrive. Operators re-publish one to its seat's inbox or discard it (a
//! discard asks first); both are audited.

use leptos::prelude::*;
use leptos_router::hooks::use_query_map;

use crate::api::{DeadLetterActionResult, DeadLetterView};
use crate::components::notice::ErrorNotice;
use crate::error::AppError;
use crate::fns::{dead_letter_action, list_dead_letters, whoami};
use crate::live::{LiveBadge, refetch_on};

/// The events after which the list is read again.
pub const DEAD_LETTER_EVENTS: &[&str] = &["message_dead_lettered"];

#[component]
pub fn DeadLettersPage() -> impl IntoView {
    let query = use_query_map();
    let seat = Signal::derive(move || query.with(|q| q.get("seat").unwrap_or_default()));
    view! {
        <section class="page">
            <div class="page-head">
                <leptos_meta::Title text="Dead letters" />
                <h1>"Dead letters"</h1>
            </div>
            <p class="muted">
                "Mail the queue gave up on: delivered too many times without success, or unreadable. Nothing here reaches its seat until an operator re-publishes it; a discarded one is gone for good. The newest 200, newest first."
            </p>
            {move || {
                let s = seat.get();
                (!s.is_empty())
                    .then(|| {
                        view! {
                            <p class="muted small">
                                {format!("Only seat {s}'s. ")}
                                <a href="/dead-letters">"Every seat's"</a>
                            </p>
                        }
                    })
            }}
            <DeadLetters seat=seat />
        </section>
    }
}

/// The dead letters (only `seat`'s, when not empty), with their actions.
/// They are read again as new ones arrive on a stream of their own, or,
/// given `refresh`, whenever it changes (a page that follows the events
/// already).
#[component]
pub fn DeadLetters(
    #[prop(into)] seat: Signal<String>,
    #[prop(optional)] refresh: Option<Signal<u64>>,
) -> impl IntoView {
    let list = Resource::new(
        move || (seat.get(), refresh.map(|r| r.get())),
        |(seat, _)| list_dead_letters(seat),
    );
    let live = refresh
        .is_none()
        .then(|| refetch_on(DEAD_LETTER_EVENTS, |_| true, move || list.refetch()));
    let me = Resource::new(|| (), |_| whoami());
    let act: Action<(u64, bool), Result<DeadLetterActionResult, AppError>> =
        Action::new(|(id, discard): &(u64, bool)| dead_letter_action(*id, *discard));
    // Read the list again after each action, whatever it came to.
    Effect::new(move |prev: Option<usize>| {
        let v = act.version().get();
        if prev.is_some_and(|p| p != v) {
            list.refetch();
        }
        v
    });
    let discarding = RwSignal::new(None::<u64>);
    view! {
        <div class="dead-letters">
            {live.map(|state| view! { <LiveBadge state /> })}
            {move || {
                act.value().get().map(|r| match r {
                    Ok(done) => view! {
                        <p class="notice notice-info" role="status" data-dead-letter-done=done.id>
                            {format!("Dead letter {}: {}.", done.id, done.result)}
                        </p>
                    }
                    .into_any(),
                    Err(e) => view! { <ErrorNotice error=e /> }.into_any(),
                })
            }}
            <Transition fallback=|| view! { <p class="muted">"Reading the dead letters…"</p> }>
                {move || {
                    let operator = me
                        .get()
                        .and_then(|r| r.ok())
                        .is_some_and(|p| p.is_operator());
                    list.get()
                        .map(|r| match r {
                            Ok(l) => {
                                let total = l.total;
                                view! {
                                    <p class="muted small" data-dead-letter-total=total>
                                        {format!("{total} kept in all.")}
                                    </p>
                                    {l.letters.is_empty().then(|| view! { <p class="muted">"No dead letters."</p> })}
                                    <ul class="dead-letter-list">
                                        {l
                                            .letters
                                            .into_iter()
                                            .map(|d| view! { <DeadLetterItem d operator act discarding /> })
                                            .collect_view()}
                                    </ul>
                                }
                                    .into_any()
                            }
                            Err(e) => view! { <ErrorNotice error=e /> }.into_any(),
                        })
                }}
            </Transition>
        </div>
    }
}

#[component]
fn DeadLetterItem(
    d: DeadLetterView,
    operator: bool,
    act: Action<(u64, bool), Result<DeadLetterActionResult, AppError>>,
    discarding: RwSignal<Option<u64>>,
) -> impl IntoView {
    let id = d.id;
    let seat = d.seat.clone();
    let busy = move || act.pending().get();
    let why_not = (!operator).then_some("Only operators re-publish or discard dead letters.");
    view! {
        <li class="dead-letter sev-error" data-dead-letter=id data-seat=seat.clone().unwrap_or_default()>
            <div class="dl-head">
                <strong>{format!("#{id}")}</strong>
                " "
                {match seat.clone() {
                    Some(s) => view! { <a class="mono" href=format!("/seats/{s}")>{s.clone()}</a> }.into_any(),
                    None => view! { <span class="mono">{d.subject.clone()}</span> }.into_any(),
                }}
                <span class="muted small">
                    " · "
                    <crate::components::time::When at=d.at.clone() />
                    {format!(" · delivered {} times", d.delivered)}
                    {d.msg_id.clone().map(|m| format!(" · id {m}"))}
                </span>
            </div>
            <p class="dl-reason">{d.reason.clone()}</p>
            <details>
                <summary>"The mail"</summary>
                <pre class="dl-payload">{d.payload.clone()}{d.truncated.then_some("…")}</pre>
            </details>
            <div class="dl-actions">
                {move || {
                    if discarding.get() == Some(id) {
                        view! {
                            <span role="group" aria-label=format!("Discard dead letter {id}?")>
                                <span>"Discard it for good? "</span>
                                <button
                                    type="button"
                                    class="danger"
                                    disabled=busy
                                    on:click=move |_| {
                                        discarding.set(None);
                                        act.dispatch((id, true));
                                    }
                                >
                                    "Discard"
                                </button>
                                <button type="button" on:click=move |_| discarding.set(None)>
                                    "Cancel"
                                </button>
                            </span>
                        }
                        .into_any()
                    } else {
                        view! {
                            <button
                                type="button"
                                disabled=move || !operator || busy()
                                title=why_not.unwrap_or("Publish it again to its seat's inbox")
                                on:click=move |_| {
                                    act.dispatch((id, false));
                                }
                            >
                                "Re-publish"
                            </button>
                            <button
                                type="button"
                                disabled=move || !operator || busy()
                                title=why_not.unwrap_or("Remove it for good")
                                on:click=move |_| discarding.set(Some(id))
                            >
                                "Discard…"
                            </button>
                        }
                        .into_any()
                    }
                }}
            </div>
        </li>
    }
}
