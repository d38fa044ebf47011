//! The audit log as a table: who did what to which seat, when, why, and
//! what came of it.

use leptos::prelude::*;

use crate::api::AuditEntry;

/// Every audited action, newest first.
#[component]
pub fn AuditTable(entries: Vec<AuditEntry>) -> impl IntoView {
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
                            view! {
                                <tr data-action=action>
                                    <td class="small" data-label="When"><crate::components::time::When at=a.at.clone() /></td>
                                    <td data-label="Who">{a.person}</td>
                                    <td data-label="Node">{a.node.unwrap_or_default()}</td>
                                    <td data-label="What">{a.action}</td>
                                    <td data-label="Seat">{a.seat.unwrap_or_default()}</td>
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
