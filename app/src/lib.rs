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

/// The node serving the dashboard, as page titles name it (the node puts
/// it in the server's context; the browser reads it from the document's
/// `crewlet-node` meta tag).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeName(pub String);

impl NodeName {
    /// The serving node's id, when known.
    fn current() -> Option<String> {
        #[cfg(feature = "hydrate")]
        {
            document()
                .query_selector("meta[name=\"crewlet-node\"]")
                .ok()
                .flatten()
                .and_then(|m| m.get_attribute("content"))
                .filter(|n| !n.is_empty())
        }
        #[cfg(not(feature = "hydrate"))]
        {
            use_context::<NodeName>().map(|n| n.0)
        }
    }
}

/// Pure: a page's title — the page, the node, the product.
pub fn page_title(page: &str, node: Option<&str>) -> String {
    match (page.is_empty(), node) {
        (true, None) => "Crewlet node".to_string(),
        (true, Some(n)) => format!("{n} · Crewlet node"),
        (false, None) => format!("{page} · Crewlet node"),
        (false, Some(n)) => format!("{page} · {n} · Crewlet node"),
    }
}

/// The HTML document around the app (server side rendering).
pub fn shell(options: LeptosOptions) -> impl IntoView {
    let node = use_context::<NodeName>().map(|n| n.0).unwrap_or_default();
    view! {
        <!DOCTYPE html>
        <html lang="en">
            <head>
                <meta charset="utf-8" />
                <meta name="viewport" content="width=device-width, initial-scale=1" />
                <meta name="crewlet-node" content=node />
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
    let node = NodeName::current();

    view! {
        <Stylesheet id="crewlet" href="/pkg/crewlet.css" />
        <Title formatter=move |page: String| page_title(&page, node.as_deref()) />
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

#[cfg(test)]
mod tests {
    use super::page_title;

    #[test]
    fn a_title_names_the_page_then_the_serving_node_then_the_product() {
        assert_eq!(
            page_title("Seats", Some("node-0")),
            "Seats · node-0 · Crewlet node"
        );
        assert_eq!(page_title("Seats", None), "Seats · Crewlet node");
        assert_eq!(page_title("", Some("node-0")), "node-0 · Crewlet node");
        assert_eq!(page_title("", None), "Crewlet node");
    }
}
