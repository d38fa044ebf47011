//! The frame every signed-in page sits in: navigation, who is signed in,
//! and the sign-out button.

use leptos::prelude::*;

use crate::fns::whoami;

#[component]
pub fn Layout(children: Children) -> impl IntoView {
    let me = Resource::new(|| (), |_| whoami());
    view! {
        <div class="frame">
            <header class="topbar">
                <a class="brand" href="/settings/nodes">"Crewlet node"</a>
                <nav aria-label="Main">
                    <a href="/settings/nodes">"Nodes"</a>
                    <a href="/seats">"Seats"</a>
                    <a href="/memory">"Memory"</a>
                    <a href="/events">"Events"</a>
                    <a href="/audit">"Audit"</a>
                    <a href="/settings/people">"People"</a>
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
                    <form method="post" action="/logout" class="signout">
                        <button type="submit">"Sign out"</button>
                    </form>
                </div>
            </header>
            <main>{children()}</main>
        </div>
    }
}
