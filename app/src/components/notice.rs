//! A sentence-shaped message box for errors and "not yet" notes.

use leptos::prelude::*;

use crate::error::AppError;

/// Show a typed error as the sentence it carries. An ended session says
/// so and sends the page to sign in, coming back here afterwards.
#[component]
pub fn ErrorNotice(error: AppError) -> impl IntoView {
    if error == AppError::NotSignedIn {
        session_ended();
        return view! {
            <p class="notice notice-error" role="alert" data-session-ended="true">
                "Your session ended. Sign in again to go on; this page comes back afterwards."
            </p>
        }
        .into_any();
    }
    view! { <p class="notice notice-error" role="alert">{error.to_string()}</p> }.into_any()
}

/// In the browser: go to `/login?next=` this page.
pub fn session_ended() {
    #[cfg(feature = "hydrate")]
    if let Some(w) = web_sys::window() {
        let loc = w.location();
        let here = format!(
            "{}{}",
            loc.pathname().unwrap_or_default(),
            loc.search().unwrap_or_default()
        );
        let next: String = here
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        let _ = loc.set_href(&format!("/login?next={next}&ended=1"));
    }
}

/// A plain information box.
#[component]
pub fn InfoNotice(children: Children) -> impl IntoView {
    view! { <div class="notice notice-info">{children()}</div> }
}
