//! Crewlet node's dashboard: the Leptos pages, the server functions they
//! call, and the data types the browser and the node share.
//!
//! This crate never depends on the engine. The node implements
//! [`console::Console`] and provides it through Leptos context; the pages
//! only ever reach the node through the server functions in [`fns`].

pub mod api;
pub mod components;
#[cfg(feature = "ssr")]
pub mod console;
pub mod error;
pub mod fns;
pub mod live;
pub mod pages;
pub mod view;

use leptos::prelude::*;
use leptos_meta::{MetaTags, Stylesheet, Title, provide_meta_context};
use leptos_router::{
    components::{Route, Router, Routes},
    path,
};

use crate::components::layout::Layout;
use crate::pages::{
    audit::AuditPage, dead_letters::DeadLettersPage, events::EventsPage, login::LoginPage,
    login::PasswordPage, memory::MemoryPage, node::NodePage, nodes::NodesPage, people::PeoplePage,
    seat::SeatPage, seats::SeatsPage,
};

/// The HTML document around the app (server side rendering).
pub fn shell(options: LeptosOptions) -> impl IntoView {
    view! {
        <!DOCTYPE html>
        <html lang="en">
            <head>
                <meta charset="utf-8" />
                <meta name="viewport" content="width=device-width, initial-scale=1" />
                <link rel="icon" href="/favicon.ico" />
                <HydrationScripts options />
                <MetaTags />
            </head>
            <body>
                <App />
            </body>
        </html>
    }
}

/// The dashboard.
#[component]
pub fn App() -> impl IntoView {
    provide_meta_context();
    mark_hydrated();

    view! {
        <Stylesheet id="crewlet" href="/pkg/crewlet.css" />
        <Title formatter=|page: String| {
            if page.is_empty() { "Crewlet node".to_string() } else { format!("{page} · Crewlet node") }
        } />
        <Router>
            <Routes fallback=|| view! { <Layout><NotFound /></Layout> }>
                <Route path=path!("/login") view=LoginPage />
                <Route path=path!("/account/password") view=PasswordPage />
                <Route path=path!("/settings/nodes") view=|| view! { <Layout><NodesPage /></Layout> } />
                <Route path=path!("/nodes/:id") view=|| view! { <Layout><NodePage /></Layout> } />
                <Route path=path!("/seats") view=|| view! { <Layout><SeatsPage /></Layout> } />
                <Route path=path!("/seats/:handle") view=|| view! { <Layout><SeatPage /></Layout> } />
                <Route path=path!("/memory") view=|| view! { <Layout><MemoryPage /></Layout> } />
                <Route path=path!("/events") view=|| view! { <Layout><EventsPage /></Layout> } />
                <Route path=path!("/audit") view=|| view! { <Layout><AuditPage /></Layout> } />
                <Route path=path!("/dead-letters") view=|| view! { <Layout><DeadLettersPage /></Layout> } />
                <Route path=path!("/settings/people") view=|| view! { <Layout><PeoplePage /></Layout> } />
            </Routes>
        </Router>
    }
}

#[component]
fn NotFound() -> impl IntoView {
    view! {
        <section class="page">
            <h1>"Not found"</h1>
            <p>"There is no page at this address. " <a href="/settings/nodes">"Go to Settings › Nodes"</a></p>
        </section>
    }
}

/// Set `data-hydrated` on the document element once the browser has
/// hydrated the page, so tests (and people's scripts) know clicks will land.
fn mark_hydrated() {
    #[cfg(feature = "hydrate")]
    Effect::new(move |_| {
        if let Some(root) = web_sys::window()
            .and_then(|w| w.document())
            .and_then(|d| d.document_element())
        {
            let _ = root.set_attribute("data-hydrated", "true");
        }
    });
}
