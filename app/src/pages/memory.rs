//! Memory: a seat's memory, answered by the node that holds the seat.

use leptos::prelude::*;

use crate::components::notice::InfoNotice;

#[component]
pub fn MemoryPage() -> impl IntoView {
    view! {
        <section class="page">
            <h1>"Memory"</h1>
            <InfoNotice>
                <p>
                    "This page will show a seat's memory — diary, episodes, counterparty profiles, skills and "
                    "conversations — answered by the node that holds the seat, saying which node answered."
                </p>
                <p>"It fills in once agent memory is stored and replicated on this node."</p>
            </InfoNotice>
        </section>
    }
}
