//! The audit log as a table: who did what to which seat, when, why, and
//! what came of it.

use leptos::prelude::*;

use crate::api::AuditEntry;

/// Every audited action, newest first; refusals marked. With `links`, a
/// row's person, action and seat are Audit filters, and its node links to
/// the node's page.
#[component]
pub fn AuditTable(entries: Vec<AuditEntry>, #[prop(optional)] links: bool) -> impl IntoView {
    if entries.is_empty() {
        return view! { <p class="muted">"Nobody has done anything yet."</p> }.into_any();
    }
    view! {
        <div class="table-wrap">
            <table class="audit stack-table">
                <thead>
                    <tr>
                        <th scope="col">"When"</th>
                        <th scope="col">"Who"</th>
                        <th scope="col">"Node"</th>
                        <th scope="col">"What"</th>
                        <th scope="col">"Seat"</th>
                        <th scope="col">"Reason"</th>
                        <th scope="col">"Result"</th>
                    </tr>
                </thead>
                <tbody>
                    {entries
                        .into_iter()
                        .map(|a| {
                            let action = a.action.clone();
                            let refused = crate::api::is_refusal(&a.result);
                            let filter = move |k: &str, v: &str| {
                                format!("/audit?{k}={}", crate::pages::encode(v))
                            };
                            let cell = move |k: &'static str, v: String| {
                                if links && !v.is_empty() {
                                    view! { <a class="filter-link" href=filter(k, &v)>{v.clone()}</a> }.into_any()
                                } else {
                                    view! { <span>{v}</span> }.into_any()
                                }
                            };
                            let node = a.node.clone().unwrap_or_default();
                            view! {
                                <tr data-action=action class:sev-error=refused data-refused=if refused { "true" } else { "false" }>
                                    <td class="small" data-label="When"><crate::components::time::When at=a.at.clone() /></td>
                                    <td data-label="Who">{cell("person", a.person.clone())}</td>
                                    <td data-label="Node">
                                        {(!node.is_empty()).then(|| view! { <a class="node-link" href=format!("/nodes/{node}")>{node.clone()}</a> })}
                                    </td>
                                    <td data-label="What">{cell("action", a.action.clone())}</td>
                                    <td data-label="Seat">{cell("seat", a.seat.clone().unwrap_or_default())}</td>
                                    <td data-label="Reason">{a.reason.unwrap_or_default()}</td>
                                    <td data-label="Result">{a.result}</td>
                                </tr>
                            }
                        })
                        .collect_view()}
                </tbody>
            </table>
        </div>
    }
    .into_any()
}
