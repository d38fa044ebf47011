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

use crate::api::NodeOrderView;
use crate::components::notice::ErrorNotice;
use crate::error::AppError;
use crate::fns::save_node_order;
use crate::view::{HANDOFFS_KEPT, HandoffView};

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

/// The order being edited: the node's answer, the person's reordering
/// not saved yet and the revision it was made from (what a save is
/// compared against), the row being dragged, and the save.
#[derive(Clone, Copy)]
struct OrderDraft {
    order: Resource<Result<NodeOrderView, AppError>>,
    draft: RwSignal<Option<Vec<String>>>,
    base: RwSignal<Option<u64>>,
    dragging: RwSignal<Option<usize>>,
    save: Action<(Vec<String>, Option<u64>), Result<NodeOrderView, AppError>>,
}

impl OrderDraft {
    fn new(order: Resource<Result<NodeOrderView, AppError>>) -> OrderDraft {
        let d = OrderDraft {
            order,
            draft: RwSignal::new(None),
            base: RwSignal::new(None),
            dragging: RwSignal::new(None),
            save: Action::new(|(nodes, revision): &(Vec<String>, Option<u64>)| {
                save_node_order(nodes.clone(), *revision)
            }),
        };
        // After a save is answered: a saved draft is done with; the order is
        // read again either way.
        Effect::new(move |prev: Option<usize>| {
            let v = d.save.version().get();
            if prev.is_some_and(|p| p != v) {
                if matches!(d.save.value().get_untracked(), Some(Ok(_))) {
                    d.draft.set(None);
                }
                d.order.refetch();
            }
            v
        });
        d
    }

    /// The node's answer, when it could be read.
    fn current(self) -> Option<NodeOrderView> {
        self.order.get().and_then(|r| r.ok())
    }

    /// Whether a save would change anything: a draft that differs from
    /// the effective order, or an order never saved (saving it fixes the
    /// first-seen order as the fleet's).
    fn savable(self) -> bool {
        let Some(current) = self.current() else {
            return false;
        };
        current.revision.is_none()
            || self
                .draft
                .get()
                .is_some_and(|draft| draft != current.effective)
    }

    /// The order shown: the draft, else the effective order.
    fn shown(self) -> Vec<String> {
        self.draft
            .get()
            .or_else(|| self.current().map(|o| o.effective))
            .unwrap_or_default()
    }

    /// Move the node at `from` to `to`, starting a draft from the order
    /// read (and remembering its revision) when there is none.
    fn reorder(self, from: usize, to: usize) {
        let read = || self.order.get_untracked().and_then(|r| r.ok());
        let now = self
            .draft
            .get_untracked()
            .unwrap_or_else(|| read().map(|o| o.effective).unwrap_or_default());
        if self.draft.get_untracked().is_none() {
            self.base.set(read().and_then(|o| o.revision));
        }
        self.draft.set(Some(moved(&now, from, to)));
    }

    /// Save the order shown, against the revision it was made from.
    fn submit(self) {
        let revision = if self.draft.get_untracked().is_some() {
            self.base.get_untracked()
        } else {
            self.current().and_then(|o| o.revision)
        };
        self.save.dispatch((self.shown(), revision));
    }

    /// Drop the draft and read the order again.
    fn discard(self) {
        self.draft.set(None);
        self.save.value().set(None);
        self.order.refetch();
    }
}

#[component]
pub fn PriorityOrder(
    order: Resource<Result<NodeOrderView, AppError>>,
    operator: Signal<bool>,
) -> impl IntoView {
    let d = OrderDraft::new(order);
    view! {
        <section class="panel priority-order" aria-labelledby="order-title">
            <h2 id="order-title">"Priority order"</h2>
            <p class="muted small">
                "Top first. When the fleet has a choice of node for a seat, it picks the highest here, within each node's fair share. Every node reads this one order."
            </p>
            <SavedBy d />
            {move || {
                order
                    .get()
                    .and_then(|r| r.err())
                    .map(|e| view! { <ErrorNotice error=e /> })
            }}
            <ol class="node-order" aria-label="Node priority order, top first">
                <For each=move || order_rows(d) key=|r| r.clone() let:r>
                    <OrderRow d operator i=r.i node=r.node len=r.len newcomer=r.newcomer />
                </For>
            </ol>
            <ChangedSince d />
            {move || {
                d.save.value()
                    .get()
                    .and_then(|r| r.err())
                    .map(|e| view! { <ErrorNotice error=e /> })
            }}
            <OrderActions d operator />
        </section>
    }
}

/// Who saved the order, and when; or that nobody has.
#[component]
fn SavedBy(d: OrderDraft) -> impl IntoView {
    move || {
        d.current().map(|o| match (o.set_by, o.set_at) {
            (Some(by), Some(at)) => view! {
                <p class="muted small" data-order-set-by=by.clone()>
                    {format!("Saved by {by} ")}
                    <crate::components::time::When at=at.clone() />
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
    }
}

/// A warning while the draft was made from a revision somebody has since
/// replaced.
#[component]
fn ChangedSince(d: OrderDraft) -> impl IntoView {
    move || {
        let current_rev = d.current().and_then(|o| o.revision);
        (d.draft.get().is_some() && current_rev != d.base.get()).then(|| {
            view! {
                <p class="notice notice-warn" role="status">
                    "Somebody saved the order while you were changing it: saving now is refused. Discard your changes to see theirs."
                </p>
            }
        })
    }
}

/// One row of the order shown: what it draws, and so what it is keyed by.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct RowKey {
    i: usize,
    node: String,
    len: usize,
    /// Not in the saved order.
    newcomer: bool,
}

/// The rows of the order shown, each with its rank. Keyed by all they
/// draw, so the order being read again without a change to what is shown
/// (every fleet event reads it again) keeps every row's elements — and the
/// focus on a row's button — where they are.
fn order_rows(d: OrderDraft) -> Vec<RowKey> {
    let list = d.shown();
    let len = list.len();
    let saved = d.current().map(|o| o.saved).unwrap_or_default();
    list.into_iter()
        .enumerate()
        .map(|(i, node)| {
            let newcomer = !saved.is_empty() && !saved.contains(&node);
            RowKey {
                i,
                node,
                len,
                newcomer,
            }
        })
        .collect()
}

/// One node of the order: draggable (for operators) onto another's place.
#[component]
fn OrderRow(
    d: OrderDraft,
    operator: Signal<bool>,
    i: usize,
    node: String,
    len: usize,
    /// Not in the saved order.
    newcomer: bool,
) -> impl IntoView {
    let dragging = d.dragging;
    let named = node.clone();
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
                        d.reorder(from, i);
                    }
                }
            }
            on:dragend=move |_| dragging.set(None)
        >
            <span class="rank">{i + 1}</span>
            <span class="mono order-node">{node.clone()}</span>
            {newcomer
                .then(|| {
                    view! {
                        <span class="muted small">
                            " · new: not in the saved order (ranked by when it was first seen)"
                        </span>
                    }
                })}
            <OrderButtons d operator i node=named len />
        </li>
    }
}

/// A row's ↑ and ↓ buttons (operators only); the pressed one keeps focus
/// after the move unless the row reached its end.
#[component]
fn OrderButtons(
    d: OrderDraft,
    operator: Signal<bool>,
    i: usize,
    node: String,
    len: usize,
) -> impl IntoView {
    move || {
        let (n_up, n_down) = (node.clone(), node.clone());
        operator.get().then(|| {
            view! {
                <span class="order-buttons">
                    <button
                        type="button"
                        id=format!("order-up-{node}")
                        data-move="up"
                        aria-label=format!("Move {n_up} up")
                        disabled={i == 0}
                        on:click=move |_| {
                            d.reorder(i, i.saturating_sub(1));
                            focus_later(focus_after_move(&n_up, true, i.saturating_sub(1), len));
                        }
                    >
                        "↑"
                    </button>
                    <button
                        type="button"
                        id=format!("order-down-{node}")
                        data-move="down"
                        aria-label=format!("Move {n_down} down")
                        disabled={i + 1 >= len}
                        on:click=move |_| {
                            d.reorder(i, i + 1);
                            focus_later(focus_after_move(&n_down, false, i + 1, len));
                        }
                    >
                        "↓"
                    </button>
                </span>
            }
        })
    }
}

/// Save and discard for operators; a sentence for viewers.
#[component]
fn OrderActions(d: OrderDraft, operator: Signal<bool>) -> impl IntoView {
    move || {
        if operator.get() {
            let unsaved = d.draft.get().is_some();
            view! {
                <div class="order-actions">
                    {unsaved.then(|| view! { <span class="small">"Unsaved changes"</span> })}
                    <button
                        type="button"
                        class="primary"
                        data-action="save-order"
                        title=move || (!d.savable()).then_some("Nothing to save: the order is as saved")
                        disabled=move || d.save.pending().get() || !d.savable()
                        on:click=move |_| d.submit()
                    >
                        "Save order"
                    </button>
                    <button type="button" data-action="discard-order" on:click=move |_| d.discard()>
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
                                                <crate::components::time::When at=h.at.clone() />
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
