//! Seats: every seat of the active company revision, its holder and state,
//! with Pause / Resume / Stop turn for operators.

use leptos::prelude::*;

use crate::components::notice::InfoNotice;

#[component]
pub fn SeatsPage() -> impl IntoView {
    view! {
        <section class="page">
            <h1>"Seats"</h1>
            <InfoNotice>
                <p>
                    "This page will list every seat of the active company revision: handle, role, placement, "
                    "holder and since, epoch, state (establishing, attached, paused, undead, unowned) and inbox depth, "
                    "with Pause, Resume and Stop turn for operators."
                </p>
                <p>"It fills in once the seat engine (placement and the seat host) runs on this node."</p>
            </InfoNotice>
        </section>
    }
}
