//! A sentence-shaped message box for errors and "not yet" notes.

use leptos::prelude::*;

use crate::error::AppError;

/// Show a typed error as the sentence it carries.
#[component]
pub fn ErrorNotice(error: AppError) -> impl IntoView {
    view! { <p class="notice notice-error" role="alert">{error.to_string()}</p> }
}

/// A plain information box.
#[component]
pub fn InfoNotice(children: Children) -> impl IntoView {
    view! { <div class="notice notice-info">{children()}</div> }
}
