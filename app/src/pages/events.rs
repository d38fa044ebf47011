//! Events: the fleet's live event log.

use leptos::prelude::*;

use crate::components::notice::InfoNotice;

#[component]
pub fn EventsPage() -> impl IntoView {
    view! {
        <section class="page">
            <h1>"Events"</h1>
            <InfoNotice>
                <p>
                    "This page will stream every node's events live (seat_claimed, seat_detached, "
                    "turn_trigger_skipped, …), filterable by type, seat and node, and pausable for reading."
                </p>
                <p>"It fills in once the node publishes its event bus."</p>
            </InfoNotice>
        </section>
    }
}
