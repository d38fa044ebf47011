//! Audit: every person's action — who, through which node, what, which
//! seat, when, why, and the result (refusals included) — newest first,
//! gathered from every live node of the fleet (each keeps its own log) and
//! refreshed live when an action's event arrives. Nodes that did not
//! answer are named: their actions are missing, not absent.

use leptos::prelude::*;
use leptos_router::hooks::use_query_map;

use crate::api::AuditView;
use crate::components::audit::AuditTable;
use crate::components::notice::ErrorNotice;
use crate::fns::audit_log;
use crate::live::{ACTION_EVENTS, LiveBadge, refetch_on};

/// The page's filters, as the address carries them
/// (`/audit?person=olivia&action=seat.pause&seat=alpha&refused=1&page=2`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuditParams {
    pub person: String,
    pub action: String,
    pub seat: String,
    pub refused: bool,
    pub page: u32,
}

impl AuditParams {
    fn of(q: &leptos_router::params::ParamsMap) -> AuditParams {
        let text = |k: &str| q.get(k).unwrap_or_default().trim().to_string();
        AuditParams {
            person: text("person"),
            action: text("action"),
            seat: text("seat"),
            refused: matches!(text("refused").as_str(), "1" | "true" | "on"),
            page: super::page_param(q),
        }
    }

    /// This view's address on page `page`.
    pub fn href(&self, page: u32) -> String {
        let refused = if self.refused { "1" } else { "" };
        super::page_href(
            "/audit",
            &[
                ("person", &self.person),
                ("action", &self.action),
                ("seat", &self.seat),
                ("refused", refused),
            ],
            page,
        )
    }

    fn filtered(&self) -> bool {
        !self.person.is_empty() || !self.action.is_empty() || !self.seat.is_empty() || self.refused
    }
}

#[component]
pub fn AuditPage() -> impl IntoView {
    let query = use_query_map();
    let params = Memo::new(move |_| query.with(AuditParams::of));
    let audit = Resource::new(
        move || params.get(),
        |p| audit_log(p.seat, p.person, p.action, p.refused, p.page),
    );
    let live = refetch_on(ACTION_EVENTS, |_| true, move || audit.refetch());
    view! {
        <section class="page">
            <div class="page-head">
                <leptos_meta::Title text="Audit" />
                <h1>"Audit"</h1>
                <LiveBadge state=live />
            </div>
            <p class="muted">
                "Every action people took through the fleet's nodes — sign-ins, pauses, resumes, stops, mail sent to a seat, companies applied, people added, dead letters re-published — with the node it was taken through, the reason given and what came of it, refusals included. Newest first, 200 a page."
            </p>
            <AuditFilters params />
            <Transition fallback=|| view! { <p class="muted">"Reading the audit log…"</p> }>
                {move || {
                    audit
                        .get()
                        .map(|r| match r {
                            Ok(v) => {
                                let p = params.get_untracked();
                                let page = v.page.max(1);
                                let newer = (page > 1).then(|| p.href(page - 1));
                                let older = v.more.then(|| p.href(page + 1));
                                view! {
                                    <Coverage log=v.clone() />
                                    <AuditTable entries=v.entries links=true />
                                    <nav class="pager" aria-label="Audit pages">
                                        {newer.map(|h| view! { <a href=h rel="prev">"Newer"</a> })}
                                        <span class="muted small">{format!("page {page}")}</span>
                                        {older.map(|h| view! { <a href=h rel="next">"Older"</a> })}
                                    </nav>
                                }
                                    .into_any()
                            }
                            Err(e) => view! { <ErrorNotice error=e /> }.into_any(),
                        })
                }}
            </Transition>
        </section>
    }
}

/// The filter bar: the filters land in the address (only those given), so
/// a view can be reloaded and shared; without script it is a plain form.
#[component]
fn AuditFilters(params: Memo<AuditParams>) -> impl IntoView {
    let person = RwSignal::new(String::new());
    let action = RwSignal::new(String::new());
    let seat = RwSignal::new(String::new());
    let refused = RwSignal::new(false);
    // The fields follow the address (a link followed, back and forward).
    Effect::new(move |_| {
        let p = params.get();
        person.set(p.person);
        action.set(p.action);
        seat.set(p.seat);
        refused.set(p.refused);
    });
    let navigate = leptos_router::hooks::use_navigate();
    let filtered = move || params.with(AuditParams::filtered);
    view! {
        <form
            class="filters audit-filters"
            method="get"
            action="/audit"
            role="search"
            on:submit=move |ev| {
                ev.prevent_default();
                let p = AuditParams {
                    person: person.get_untracked().trim().to_string(),
                    action: action.get_untracked().trim().to_string(),
                    seat: seat.get_untracked().trim().to_string(),
                    refused: refused.get_untracked(),
                    page: 1,
                };
                navigate(&p.href(1), Default::default());
            }
        >
            <label>
                "Person "
                <input name="person" maxlength="200" prop:value=move || person.get() on:input=move |ev| person.set(event_target_value(&ev)) />
            </label>
            <label>
                "Action "
                <input name="action" maxlength="200" placeholder="seat.pause" prop:value=move || action.get() on:input=move |ev| action.set(event_target_value(&ev)) />
            </label>
            <label>
                "Seat "
                <input name="seat" maxlength="200" prop:value=move || seat.get() on:input=move |ev| seat.set(event_target_value(&ev)) />
            </label>
            <label>
                <input type="checkbox" name="refused" value="1" prop:checked=move || refused.get() on:change=move |ev| refused.set(event_target_checked(&ev)) />
                " Refused only"
            </label>
            <button type="submit">"Filter"</button>
            {move || filtered().then(|| view! { <a class="small" href="/audit">"Clear filters"</a> })}
        </form>
    }
}

/// Which nodes' actions are listed, and which live nodes' are missing.
#[component]
fn Coverage(log: AuditView) -> impl IntoView {
    let answered = log.answered.join(", ");
    view! {
        <p class="muted small" data-audit-answered=answered.clone()>
            {format!("Gathered from {answered}.")}
        </p>
        {(!log.silent.is_empty())
            .then(|| {
                view! {
                    <div class="notice notice-warn" role="status" data-audit-silent="true">
                        <p>
                            <strong>"Some nodes' actions are missing: "</strong>
                            "these live nodes did not answer, so what was done through them is not listed."
                        </p>
                        <ul>
                            {log
                                .silent
                                .iter()
                                .map(|s| {
                                    view! {
                                        <li data-node=s.node_id.clone()>
                                            <strong>{s.node_id.clone()}</strong>
                                            {format!(": {}", s.why)}
                                        </li>
                                    }
                                })
                                .collect_view()}
                        </ul>
                    </div>
                }
            })}
        {log
            .roster_error
            .map(|why| {
                view! {
                    <div class="notice notice-warn" role="status" data-audit-roster="unreadable">
                        <p>
                            <strong>"Only this node's actions are listed: "</strong>
                            {why}
                        </p>
                    </div>
                }
            })}
    }
}
