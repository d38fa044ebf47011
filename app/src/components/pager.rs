//! A list page's pager: "Page p of n · m matching" between a previous and
//! a next link, each plain text at its end of the list.

use leptos::prelude::*;

/// `href(page)` is the link to that page of the list; `label` names the
/// navigation for assistive technology ("Seat pages").
#[component]
pub fn Pager(
    label: &'static str,
    page: u32,
    pages: u32,
    matching: usize,
    href: impl Fn(u32) -> String + 'static,
) -> impl IntoView {
    let paging = format!("Page {page} of {pages} · {matching} matching");
    let prev = (page > 1).then(|| href(page - 1));
    let next = (page < pages).then(|| href(page + 1));
    view! {
        <nav class="pager" aria-label=label>
            {match prev {
                Some(href) => view! { <a href=href rel="prev">"‹ Previous"</a> }.into_any(),
                None => view! { <span class="muted">"‹ Previous"</span> }.into_any(),
            }}
            <span class="muted">{paging}</span>
            {match next {
                Some(href) => view! { <a href=href rel="next">"Next ›"</a> }.into_any(),
                None => view! { <span class="muted">"Next ›"</span> }.into_any(),
            }}
        </nav>
    }
}

// Rendering to HTML needs the server half (`cargo test` at the workspace
// root builds this crate with `ssr`, as the node does).
#[cfg(all(test, feature = "ssr"))]
mod tests {
    use super::*;

    fn render(page: u32, pages: u32) -> String {
        Owner::new().with(|| {
            view! {
                <Pager
                    label="Seat pages"
                    page=page
                    pages=pages
                    matching=120
                    href=|p| format!("/seats?page={p}")
                />
            }
            .to_html()
        })
    }

    #[test]
    fn the_pager_links_each_neighbouring_page_and_leaves_an_end_as_text() {
        let first = render(1, 3);
        assert!(first.contains("Page 1 of 3 · 120 matching"), "{first}");
        assert!(
            first.contains(r#"href="/seats?page=2" rel="next""#),
            "{first}"
        );
        assert!(!first.contains(r#"rel="prev""#), "{first}");
        let middle = render(2, 3);
        assert!(
            middle.contains(r#"href="/seats?page=1" rel="prev""#),
            "{middle}"
        );
        assert!(
            middle.contains(r#"href="/seats?page=3" rel="next""#),
            "{middle}"
        );
        let last = render(3, 3);
        assert!(!last.contains(r#"rel="next""#), "{last}");
        assert!(last.contains(r#"aria-label="Seat pages""#), "{last}");
    }
}
