//! Settings › Nodes' two panels about where seats go next:
//!
//! - **Priority order**: the order every node ranks the live fleet by (the
//!   saved order over the nodes present now). Operators reorder it by drag
//!   and drop or with each row's ↑ / ↓ buttons (keyboard-accessible), then
//!   save it against the revision they read — somebody else's save since is
//!   refused with a sentence saying to reload. Viewers read it. It follows
//!   the event stream: another person's save shows up by itself.
//! - **Handoffs**: the last [`HANDOFFS_KEPT`] handoffs seen on the event
//!   stream since the page opened — offered → taken (with the seat's dark
//!   time) or withdrawn (and why).
//!
//! Nothing here decides anything: the order is the node's answer, the
//! handoffs are the fleet's events.

use leptos::prelude::*;

use crate::api::{HANDOFFS_KEPT, HandoffView, NodeOrderView};
use crate::components::notice::ErrorNotice;
use crate::error::AppError;
use crate::fns::save_node_order;

/// Pure: `list` with the entry at `from` moved to position `to` (clamped
/// to the list); `from` past the end changes nothing.
pub fn moved(list: &[String], from: usize, to: usize) -> Vec<String> {
    let mut v = list.to_vec();
    if from >= v.len() {
        return v;
    }
    let item = v.remove(from);
    let to = to.min(v.len());
    v.insert(to, item);
    v
}

/// `HH:MM:SS` of an RFC 3339 timestamp (UTC, as the node writes them).
fn hhmmss(at: &str) -> String {
    at.get(11..19).unwrap_or(at).to_string()
}

/// Which of a row's buttons to focus after it moved to `to` of `len`: the
/// one pressed, unless the row reached the end it points to.
fn focus_after_move(node: &str, up: bool, to: usize, len: usize) -> String {
    let up = if up { to > 0 } else { to + 1 >= len };
    format!("order-{}-{node}", if up { "up" } else { "down" })
}

/// Focus the element with `id` once the list has been drawn again.
fn focus_later(id: String) {
    #[cfg(feature = "hydrate")]
    request_animation_frame(move || {
        use wasm_bindgen::JsCast;
        if let Some(el) = document()
            .get_element_by_id(&id)
            .and_then(|e| e.dyn_into::<web_sys::HtmlElement>().ok())
        {
            let _ = el.focus();
        }
    });
    #[cfg(not(feature = "hydrate"))]
    let _ = id;
}

#[component]
pub fn PriorityOrder(
    order: Resource<Result<NodeOrderView, AppError>>,
    operator: Signal<bool>,
) -> impl IntoView {
    // The person's reordering, not saved yet, and the revision it was
    // made from (what a save is compared against).
    let draft = RwSignal::new(None::<Vec<String>>);
    let base = RwSignal::new(None::<u64>);
    let dragging = RwSignal::new(None::<usize>);
    let save = Action::new(|(nodes, revision): &(Vec<String>, Option<u64>)| {
        save_node_order(nodes.clone(), *revision)
    });
    // After a save is answered: a saved draft is done with; the order is
    // read again either way.
    Effect::new(move |prev: Option<usize>| {
        let v = save.version().get();
        if prev.is_some_and(|p| p != v) {
            if matches!(save.value().get_untracked(), Some(Ok(_))) {
                draft.set(None);
            }
            order.refetch();
        }
        v
    });

    let current = move || order.get().and_then(|r| r.ok());
    let shown = move || {
        draft
            .get()
            .or_else(|| current().map(|o| o.effective))
            .unwrap_or_default()
    };
    let reorder = move |from: usize, to: usize| {
        let now = draft.get_untracked().unwrap_or_else(|| {
            order
                .get_untracked()
                .and_then(|r| r.ok())
                .map(|o| o.effective)
                .unwrap_or_default()
        });
        if draft.get_untracked().is_none() {
            base.set(
                order
                    .get_untracked()
                    .and_then(|r| r.ok())
                    .and_then(|o| o.revision),
            );
        }
        draft.set(Some(moved(&now, from, to)));
    };
    let on_save = move |_| {
        let revision = if draft.get_untracked().is_some() {
            base.get_untracked()
        } else {
            current().and_then(|o| o.revision)
        };
        save.dispatch((shown(), revision));
    };
    let discard = move |_| {
        draft.set(None);
        save.value().set(None);
        order.refetch();
    };

    let rows = move || {
        let list = shown();
        let len = list.len();
        let saved = current().map(|o| o.saved).unwrap_or_default();
        list.into_iter()
            .enumerate()
            .map(|(i, node)| {
                let unsaved_newcomer = !saved.is_empty() && !saved.contains(&node);
                let up_id = format!("order-up-{node}");
                let down_id = format!("order-down-{node}");
                let (n_up, n_down) = (node.clone(), node.clone());
                let buttons = move || {
                    let (n_up, n_down) = (n_up.clone(), n_down.clone());
                    let (up_id, down_id) = (up_id.clone(), down_id.clone());
                    operator.get().then(|| {
                        view! {
                            <span class="order-buttons">
                                <button
                                    type="button"
                                    id=up_id
                                    data-move="up"
                                    aria-label=format!("Move {n_up} up")
                                    disabled={i == 0}
                                    on:click=move |_| {
                                        reorder(i, i.saturating_sub(1));
                                        focus_later(focus_after_move(&n_up, true, i.saturating_sub(1), len));
                                    }
                                >
                                    "↑"
                                </button>
                                <button
                                    type="button"
                                    id=down_id
                                    data-move="down"
                                    aria-label=format!("Move {n_down} down")
                                    disabled={i + 1 >= len}
                                    on:click=move |_| {
                                        reorder(i, i + 1);
                                        focus_later(focus_after_move(&n_down, false, i + 1, len));
                                    }
                                >
                                    "↓"
                                </button>
                            </span>
                        }
                    })
                };
                view! {
                    <li
                        data-node=node.clone()
                        draggable=move || if operator.get() { "true" } else { "false" }
                        class:dragging=move || dragging.get() == Some(i)
                        on:dragstart=move |ev: leptos::ev::DragEvent| {
                            if !operator.get_untracked() {
                                ev.prevent_default();
                                return;
                            }
                            dragging.set(Some(i));
                            #[cfg(feature = "hydrate")]
                            if let Some(dt) = ev.data_transfer() {
                                dt.set_effect_allowed("move");
                                let _ = dt.set_data("text/plain", &i.to_string());
                            }
                        }
                        on:dragover=move |ev: leptos::ev::DragEvent| {
                            if dragging.get_untracked().is_some() {
                                ev.prevent_default();
                            }
                        }
                        on:drop=move |ev: leptos::ev::DragEvent| {
                            ev.prevent_default();
                            if let Some(from) = dragging.get_untracked() {
                                dragging.set(None);
                                if from != i {
                                    reorder(from, i);
                                }
                            }
                        }
                        on:dragend=move |_| dragging.set(None)
                    >
                        <span class="rank">{i + 1}</span>
                        <span class="mono order-node">{node.clone()}</span>
                        {unsaved_newcomer
                            .then(|| {
                                view! {
                                    <span class="muted small">
                                        " · new: not in the saved order (ranked by when it was first seen)"
                                    </span>
                                }
                            })}
                        {buttons}
                    </li>
                }
            })
            .collect_view()
    };

    let who = move || {
        current().map(|o| match (o.set_by, o.set_at) {
            (Some(by), Some(at)) => view! {
                <p class="muted small" data-order-set-by=by.clone()>
                    {format!("Saved by {by} at ")}
                    <time datetime=at.clone() title=at.clone()>{hhmmss(&at)}</time>
                    {o.revision.map(|r| format!(" (revision {r})"))}
                </p>
            }
            .into_any(),
            _ => view! {
                <p class="muted small">
                    "No order saved yet: the nodes are ranked by when each was first seen."
                </p>
            }
            .into_any(),
        })
    };
    let changed_since = move || {
        let current_rev = current().and_then(|o| o.revision);
        (draft.get().is_some() && current_rev != base.get()).then(|| {
            view! {
                <p class="notice notice-warn" role="status">
                    "Somebody saved the order while you were changing it: saving now is refused. Discard your changes to see theirs."
                </p>
            }
        })
    };

    view! {
        <section class="panel priority-order" aria-labelledby="order-title">
            <h2 id="order-title">"Priority order"</h2>
            <p class="muted small">
                "Top first. When the fleet has a choice of node for a seat, it picks the highest here, within each node's fair share. Every node reads this one order."
            </p>
            {who}
            {move || {
                order
                    .get()
                    .and_then(|r| r.err())
                    .map(|e| view! { <ErrorNotice error=e /> })
            }}
            <ol class="node-order" aria-label="Node priority order, top first">
                {rows}
            </ol>
            {changed_since}
            {move || {
                save.value()
                    .get()
                    .and_then(|r| r.err())
                    .map(|e| view! { <ErrorNotice error=e /> })
            }}
            {move || {
                if operator.get() {
                    let unsaved = draft.get().is_some();
                    view! {
                        <div class="order-actions">
                            {unsaved.then(|| view! { <span class="small">"Unsaved changes"</span> })}
                            <button
                                type="button"
                                class="primary"
                                data-action="save-order"
                                disabled=move || save.pending().get()
                                on:click=on_save
                            >
                                "Save order"
                            </button>
                            <button type="button" data-action="discard-order" on:click=discard>
                                "Discard changes"
                            </button>
                        </div>
                        <p class="muted small">
                            "Drag a node to its place, or use its ↑ and ↓ buttons, then save."
                        </p>
                    }
                        .into_any()
                } else {
                    view! {
                        <p class="muted small">
                            "You are signed in as a viewer: only operators may change the order."
                        </p>
                    }
                        .into_any()
                }
            }}
        </section>
    }
}

#[component]
pub fn Handoffs(list: RwSignal<Vec<HandoffView>>) -> impl IntoView {
    view! {
        <section class="panel handoffs" aria-labelledby="handoffs-title">
            <h2 id="handoffs-title">"Handoffs"</h2>
            <p class="muted small">
                {format!(
                    "Seats handed from one node to another since this page opened (the last {HANDOFFS_KEPT}): offered → taken, with how long no turn could run, or withdrawn."
                )}
            </p>
            {move || {
                if list.with(|l| l.is_empty()) {
                    view! { <p class="muted">"No handoff since this page opened."</p> }.into_any()
                } else {
                    view! {
                        <div class="table-wrap">
                            <table class="handoffs-table">
                                <thead>
                                    <tr>
                                        <th scope="col">"When"</th>
                                        <th scope="col">"Seat"</th>
                                        <th scope="col">"From"</th>
                                        <th scope="col">"Handoff"</th>
                                        <th scope="col">"Why"</th>
                                    </tr>
                                </thead>
                                <tbody>
                                    <For
                                        each=move || list.get()
                                        key=|h| format!("{h:?}")
                                        let:h
                                    >
                                        <tr
                                            data-seat=h.seat.clone()
                                            data-epoch=h.epoch
                                            data-state=h.state_name()
                                        >
                                            <td class="mono small">
                                                <time datetime=h.at.clone() title=h.at.clone()>
                                                    {hhmmss(&h.at)}
                                                </time>
                                            </td>
                                            <td class="mono">{h.seat.clone()}</td>
                                            <td>
                                                {h.from.clone().unwrap_or_else(|| "—".into())}
                                                <span class="muted small">
                                                    {format!(" · epoch {}", h.epoch)}
                                                </span>
                                            </td>
                                            <td>
                                                <span class=format!(
                                                    "badge badge-handoff-{}",
                                                    h.state_name(),
                                                )>{h.status()}</span>
                                            </td>
                                            <td class="small">
                                                {h.reason.clone().unwrap_or_default()}
                                            </td>
                                        </tr>
                                    </For>
                                </tbody>
                            </table>
                        </div>
                    }
                        .into_any()
                }
            }}
        </section>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn moving_a_node_puts_it_at_the_place_it_was_dropped() {
        let l = s(&["a", "b", "c", "d"]);
        assert_eq!(moved(&l, 0, 2), s(&["b", "c", "a", "d"]));
        assert_eq!(moved(&l, 3, 0), s(&["d", "a", "b", "c"]));
        assert_eq!(moved(&l, 1, 1), l);
        assert_eq!(moved(&l, 1, 99), s(&["a", "c", "d", "b"]));
        assert_eq!(moved(&l, 9, 0), l, "a stale index changes nothing");
    }

    #[test]
    fn after_a_move_the_pressed_button_keeps_focus_unless_the_row_hit_the_end() {
        assert_eq!(focus_after_move("n", true, 1, 3), "order-up-n");
        assert_eq!(focus_after_move("n", true, 0, 3), "order-down-n");
        assert_eq!(focus_after_move("n", false, 1, 3), "order-down-n");
        assert_eq!(focus_after_move("n", false, 2, 3), "order-up-n");
    }
}
