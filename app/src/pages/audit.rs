//! Audit: every person's action — who, what, which seat, when, why, and
//! the result (refusals included) — newest first, refreshed live when an
//! action's event arrives.

use leptos::prelude::*;

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
                <h1>"Audit"</h1>
                <LiveBadge state=live />
            </div>
            <p class="muted">
                "Every action people took through this node — sign-ins, pauses, resumes, stops, mail sent to a seat, companies applied, people added — with the reason given and what came of it, refusals included. The newest 200, newest first."
            </p>
            <Transition fallback=|| view! { <p class="muted">"Reading the audit log…"</p> }>
                {move || {
                    audit
                        .get()
                        .map(|r| match r {
                            Ok(v) => view! { <AuditTable entries=v /> }.into_any(),
                            Err(e) => view! { <ErrorNotice error=e /> }.into_any(),
                        })
                }}
            </Transition>
        </section>
    }
}
