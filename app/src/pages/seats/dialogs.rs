//! The seat list's dialogs: the confirmation a pause, resume or stop asks
//! for (naming the seat and what its holder will do), and the move dialog
//! that picks the node a seat goes to.

use leptos::prelude::*;

use super::*;

/// The title and sentence of a confirmation, naming the seat and what its
/// holder (if any) will do.
fn confirm_words(c: &Confirm) -> (String, String) {
    match (c.ask, &c.holder) {
        (Ask::Pause, Some(n)) => (
            format!("Pause {}?", c.handle),
            format!(
                "{n} holds it: it keeps the seat's mail and starts no new turn until a resume."
            ),
        ),
        (Ask::Pause, None) => (
            format!("Pause {}?", c.handle),
            "Nobody holds it now: the node that takes it keeps its mail until a resume."
                .to_string(),
        ),
        (Ask::Resume, Some(n)) => (
            format!("Resume {}?", c.handle),
            format!("{n} holds it: its turns start again."),
        ),
        (Ask::Resume, None) => (
            format!("Resume {}?", c.handle),
            "Nobody holds it now: the node that takes it runs its turns.".to_string(),
        ),
        (Ask::Stop, Some(n)) => (
            format!("Stop {}'s running turn?", c.handle),
            format!(
                "{n} holds it: the running turn ends at its next round. The seat is not paused."
            ),
        ),
        (Ask::Stop, None) => (
            format!("Stop {}'s running turn?", c.handle),
            "Nobody holds it now, so no turn is running.".to_string(),
        ),
    }
}

#[component]
pub(super) fn ConfirmDialog(confirming: Confirming, act: SeatAct) -> impl IntoView {
    let Confirming {
        dialog,
        confirm,
        reason,
        stop_too,
        focus_after,
    } = confirming;
    view! {
        <dialog
            node_ref=dialog
            class="confirm"
            aria-labelledby="confirm-title"
            on:close=move |_| confirm.set(None)
        >
            {move || {
                confirm
                    .get()
                    .map(|c| {
                        let (title, body) = confirm_words(&c);
                        let Confirm { ask, handle, .. } = c;
                        view! {
                            <form
                                data-confirm=ask.name()
                                on:submit=move |ev| {
                                    ev.prevent_default();
                                    focus_after.set(Some(handle.clone()));
                                    act.dispatch(Request {
                                        ask,
                                        handle: handle.clone(),
                                        reason: reason.get_untracked(),
                                        stop_running_turn: ask == Ask::Pause && stop_too.get_untracked(),
                                    });
                                    confirming.close();
                                }
                            >
                                <h2 id="confirm-title">{title}</h2>
                                <p>{body}</p>
                                <ConfirmFields ask reason stop_too />
                                <div class="dialog-actions">
                                    <button type="button" on:click=move |_| confirming.close()>"Cancel"</button>
                                    <button type="submit" class="primary">{ask.button()}</button>
                                </div>
                            </form>
                        }
                    })
            }}
        </dialog>
    }
}

/// A confirmation's optional reason (not for a resume) and, for a pause,
/// "also stop the running turn".
#[component]
fn ConfirmFields(ask: Ask, reason: RwSignal<String>, stop_too: RwSignal<bool>) -> impl IntoView {
    view! {
        {(ask != Ask::Resume)
            .then(|| {
                view! {
                    <label for="confirm-reason">"Reason (optional)"</label>
                    <input
                        id="confirm-reason"
                        type="text"
                        maxlength="500"
                        autocomplete="off"
                        bind:value=reason
                    />
                }
            })}
        {(ask == Ask::Pause)
            .then(|| {
                view! {
                    <label class="check">
                        <input id="confirm-stop" type="checkbox" bind:checked=stop_too />
                        "Also stop the running turn"
                    </label>
                }
            })}
    }
}

/// Move…: the seat being moved, the live nodes (read when the dialog
/// opens), the node and reason picked, and what the node answered. A
/// refusal stays in the dialog; a recorded request closes it.
#[derive(Clone, Copy)]
pub(super) struct Moving {
    dialog: NodeRef<leptos::html::Dialog>,
    moving: RwSignal<Option<MoveAsk>>,
    to: RwSignal<String>,
    reason: RwSignal<String>,
    error: RwSignal<Option<AppError>>,
    pub(super) moved: RwSignal<Option<MoveRequestView>>,
    live_nodes: Action<(), Result<FleetView, AppError>>,
    act: Action<MoveRequest, Result<MoveRequestView, AppError>>,
}

impl Moving {
    /// A move dialog whose recorded move reads `list` again.
    pub(super) fn new(list: Listed) -> Moving {
        let m = Moving {
            dialog: NodeRef::new(),
            moving: RwSignal::new(None),
            to: RwSignal::new(String::new()),
            reason: RwSignal::new(String::new()),
            error: RwSignal::new(None),
            moved: RwSignal::new(None),
            live_nodes: Action::new(|_: &()| fleet()),
            act: Action::new(|r: &MoveRequest| {
                move_seat(r.handle.clone(), r.node.clone(), r.reason.clone())
            }),
        };
        // The first live node that does not hold the seat is picked to start.
        Effect::new(move |_| {
            if let Some(Ok(f)) = m.live_nodes.value().get()
                && m.to.get_untracked().is_empty()
            {
                let holder = m.moving.get_untracked().and_then(|a| a.holder);
                let pick = f
                    .nodes
                    .iter()
                    .find(|n| Some(&n.node_id) != holder.as_ref())
                    .or(f.nodes.first())
                    .map(|n| n.node_id.clone());
                if let Some(p) = pick {
                    m.to.set(p);
                }
            }
        });
        Effect::new(move |prev: Option<usize>| {
            let v = m.act.version().get();
            if prev.is_some_and(|p| p != v) {
                match m.act.value().get_untracked() {
                    Some(Ok(req)) => {
                        m.error.set(None);
                        m.moved.set(Some(req));
                        m.close();
                        list.refetch();
                    }
                    Some(Err(e)) => m.error.set(Some(e)),
                    None => {}
                }
            }
            v
        });
        m
    }

    pub(super) fn open(self, a: MoveAsk) {
        self.to.set(String::new());
        self.reason.set(String::new());
        self.error.set(None);
        self.moving.set(Some(a));
        self.live_nodes.dispatch(());
        if let Some(d) = self.dialog.get() {
            let _ = d.show_modal();
        }
    }

    fn close(self) {
        if let Some(d) = self.dialog.get() {
            d.close();
        }
    }
}

#[component]
pub(super) fn MoveDialog(moving: Moving) -> impl IntoView {
    view! {
        <dialog
            node_ref=moving.dialog
            class="move-dialog"
            aria-labelledby="move-title"
            on:close=move |_| moving.moving.set(None)
        >
            {move || moving.moving.get().map(|a| view! { <MoveForm moving a /> })}
        </dialog>
    }
}

/// The move form for one seat: the node to move it to and why.
#[component]
fn MoveForm(moving: Moving, a: MoveAsk) -> impl IntoView {
    let body = match &a.holder {
        Some(n) => format!(
            "{n} holds it now. It hands the seat over once the node you pick has it ready; no turn runs on both."
        ),
        None => "Nobody holds it now: the node you pick claims it.".to_string(),
    };
    let MoveAsk { handle, holder } = a;
    let title = format!("Move {handle}");
    view! {
        <form
            data-confirm="move"
            on:submit=move |ev| {
                ev.prevent_default();
                moving.error.set(None);
                moving.act.dispatch(MoveRequest {
                    handle: handle.clone(),
                    node: moving.to.get_untracked(),
                    reason: moving.reason.get_untracked(),
                });
            }
        >
            <h2 id="move-title">{title}</h2>
            <p>{body}</p>
            <label for="move-node">"To node"</label>
            <select
                id="move-node"
                required
                on:change=move |ev| moving.to.set(event_target_value(&ev))
            >
                <MoveTargets moving holder />
            </select>
            <label for="move-reason">"Reason (required; it is audited)"</label>
            <input
                id="move-reason"
                type="text"
                required
                maxlength="500"
                autocomplete="off"
                bind:value=moving.reason
            />
            {move || {
                moving
                    .error
                    .get()
                    .map(|e| {
                        view! {
                            <p class="notice notice-error" role="alert" data-move-error="true">
                                {e.to_string()}
                            </p>
                        }
                    })
            }}
            <div class="dialog-actions">
                <button type="button" on:click=move |_| moving.close()>"Cancel"</button>
                <button type="submit" class="primary" disabled=move || moving.act.pending().get()>
                    "Move"
                </button>
            </div>
        </form>
    }
}

/// The live nodes to move a seat to, the one holding it (`holder`) marked.
#[component]
fn MoveTargets(moving: Moving, holder: Option<String>) -> impl IntoView {
    move || match moving.live_nodes.value().get() {
        None => view! {
            <option value="" disabled selected>
                "Reading the live nodes…"
            </option>
        }
        .into_any(),
        Some(Err(_)) => view! {
            <option value="" disabled selected>
                "The live nodes cannot be read"
            </option>
        }
        .into_any(),
        Some(Ok(f)) => f
            .nodes
            .into_iter()
            .map(|n| {
                let id = n.node_id.clone();
                let here = holder.as_deref() == Some(id.as_str());
                let label = format!(
                    "{id} ({}{})",
                    n.status.as_str(),
                    if here { ", holds it now" } else { "" },
                );
                let sel = id.clone();
                view! {
                    <option value=id selected=move || moving.to.get() == sel>
                        {label}
                    </option>
                }
            })
            .collect_view()
            .into_any(),
    }
}
