//! The frame every signed-in page sits in: a skip link, navigation (the
//! current page marked), who is signed in, and the sign-out button.

use leptos::prelude::*;
use leptos_router::components::A;

use crate::fns::{dead_letter_count, whoami};

#[component]
pub fn Layout(children: Children) -> impl IntoView {
    let me = Resource::new(|| (), |_| whoami());
    // The dead letters kept, read in the browser after each navigation
    // (the page is rendered without it, so hydration never waits on it).
    let location = leptos_router::hooks::use_location();
    let dead = RwSignal::new(None::<u64>);
    Effect::new(move |_| {
        location.pathname.track();
        leptos::task::spawn_local(async move {
            if let Ok(n) = dead_letter_count().await {
                dead.set(Some(n));
            }
        });
    });
    let main = NodeRef::<leptos::html::Main>::new();
    // One clock for every time on the page (and the switch between the
    // browser's and UTC).
    crate::components::time::Times::get();
    view! {
        <div class="frame">
            <a
                class="skip"
                href="#main"
                on:click=move |ev| {
                    // Focus the content itself (the router would only navigate).
                    ev.prevent_default();
                    if let Some(m) = main.get() {
                        let _ = m.focus();
                    }
                }
            >
                "Skip to content"
            </a>
            <header class="topbar">
                <a class="brand" href="/settings/nodes">"Crewlet node"</a>
                <nav aria-label="Main">
                    <A href="/settings/nodes">"Nodes"</A>
                    <A href="/seats">"Seats"</A>
                    <A href="/memory">"Memory"</A>
                    <A href="/events">"Events"</A>
                    <span class="nav-with-count">
                        <A href="/dead-letters">"Dead letters"</A>
                        {move || {
                            dead.get()
                                .filter(|n| *n > 0)
                                .map(|n| {
                                    view! {
                                        <a class="count" href="/dead-letters" data-dead-letter-count=n title=format!("{n} dead letters kept")>
                                            {n}
                                        </a>
                                    }
                                })
                        }}
                    </span>
                    <A href="/audit">"Audit"</A>
                    <A href="/settings/people">"People"</A>
                </nav>
                <div class="who">
                    <Suspense fallback=|| ()>
                        {move || {
                            me.get()
                                .and_then(|r| r.ok())
                                .map(|p| {
                                    view! {
                                        <span class="person" data-role=p.role.as_str()>
                                            {p.name.clone()}
                                            <span class="role">{p.role.as_str()}</span>
                                        </span>
                                    }
                                })
                        }}
                    </Suspense>
                    <crate::components::time::ClockSwitch />
                    <form method="post" action="/logout" class="signout">
                        <button type="submit">"Sign out"</button>
                    </form>
                </div>
            </header>
            <main id="main" tabindex="-1" node_ref=main>{children()}</main>
        </div>
    }
}
