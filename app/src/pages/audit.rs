//! Audit: every person's action — who, through which node, what, which
//! seat, when, why, and the result (refusals included) — newest first,
//! gathered from every live node of the fleet (each keeps its own log) and
//! refreshed live when an action's event arrives. Nodes that did not
//! answer are named: their actions are missing, not absent.

use leptos::prelude::*;

use crate::api::AuditView;
use crate::components::audit::AuditTable;
use crate::components::notice::ErrorNotice;
use crate::fns::audit_log;
use crate::live::{ACTION_EVENTS, LiveBadge, refetch_on};

#[component]
pub fn AuditPage() -> impl IntoView {
    let audit = Resource::new(|| (), |_| audit_log());
    let live = refetch_on(ACTION_EVENTS, |_| true, move || audit.refetch());
    view! {
        <section class="page">
            <div class="page-head">
                <leptos_meta::Title text="Audit" />
                <h1>"Audit"</h1>
                <LiveBadge state=live />
            </div>
            <p class="muted">
                "Every action people took through the fleet's nodes — sign-ins, pauses, resumes, stops, mail sent to a seat, companies applied, people added — with the node it was taken through, the reason given and what came of it, refusals included. The newest 200, newest first."
            </p>
            <Transition fallback=|| view! { <p class="muted">"Reading the audit log…"</p> }>
                {move || {
                    audit
                        .get()
                        .map(|r| match r {
                            Ok(v) => {
                                view! {
                                    <Coverage log=v.clone() />
                                    <AuditTable entries=v.entries />
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
