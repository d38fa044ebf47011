//! The sign-in page and the page where a person chooses a new password.
//! Both are plain HTML forms posting to the node (`/login`,
//! `/account/password`), so they work before (and without) hydration. A
//! failed attempt comes back here with the name typed and where the
//! person was going (`next`) kept.

use leptos::prelude::*;
use leptos_router::hooks::use_query_map;

/// The sentence for a sign-in `error=` code.
fn sign_in_error(code: &str) -> &'static str {
    match code {
        "limited" => {
            "Too many sign-in attempts from here or for this name. Wait a little, then try again."
        }
        "busy" => "The node is checking too many sign-ins at once. Try again in a moment.",
        "origin" => "That sign-in came from another site and was refused.",
        _ => "That name and password do not match. Try again.",
    }
}

#[component]
pub fn LoginPage() -> impl IntoView {
    let query = use_query_map();
    let error = move || query.with(|q| q.get("error").map(|e| sign_in_error(&e)));
    let signed_out = move || query.with(|q| q.get("signed_out").is_some());
    let ended = move || query.with(|q| q.get("ended").is_some());
    let next = move || query.with(|q| q.get("next").unwrap_or_default());
    let name = move || query.with(|q| q.get("name").unwrap_or_default());
    let focus_password = move || query.with(|q| q.get("name").is_some());
    view! {
        <main class="login">
            <form method="post" action="/login" class="card login-card">
                <leptos_meta::Title text="Sign in" />
                <h1>"Crewlet node"</h1>
                <p class="muted">"Sign in to watch and steer this fleet."</p>
                {move || error().map(|e| view! { <p class="notice notice-error" role="alert">{e}</p> })}
                {move || signed_out().then(|| view! { <p class="notice notice-info" role="status">"You signed out."</p> })}
                {move || ended().then(|| view! { <p class="notice notice-info" role="status" data-session-ended="true">"Your session ended. Sign in again to go back where you were."</p> })}
                <input type="hidden" name="next" value=next />
                <label for="name">"Name"</label>
                <input id="name" name="name" type="text" autocomplete="username" required value=name autofocus=move || !focus_password() />
                <label for="password">"Password"</label>
                <input id="password" name="password" type="password" autocomplete="current-password" required autofocus=focus_password />
                <button type="submit" class="primary">"Sign in"</button>
            </form>
        </main>
    }
}

/// The sentence for a password change's `error=` code.
fn password_error(code: &str) -> &'static str {
    match code {
        "mismatch" => "The two new passwords differ. Type the same one twice.",
        "current" => "Your current password was not right. Try again.",
        "length" => "Choose a password of 12 to 256 characters.",
        "same" => "Choose a password other than your current one.",
        "file" => {
            "Your sign-in is defined in the company file: change its password_hash there (crewlet hash-password makes one)."
        }
        "token" => "An API token has no password to change.",
        "limited" => "Too many attempts. Wait a little, then try again.",
        _ => "The node could not change the password right now. Try again.",
    }
}

/// `/account/password`: change your own password (required after the
/// first sign-in with a generated one).
#[component]
pub fn PasswordPage() -> impl IntoView {
    let query = use_query_map();
    let error = move || query.with(|q| q.get("error").map(|e| password_error(&e)));
    let next = move || query.with(|q| q.get("next").unwrap_or_default());
    view! {
        <main class="login">
            <form method="post" action="/account/password" class="card login-card">
                <leptos_meta::Title text="Your password" />
                <h1>"Choose a new password"</h1>
                <p class="muted">"At least 12 characters. Only its hash is kept."</p>
                {move || error().map(|e| view! { <p class="notice notice-error" role="alert">{e}</p> })}
                <input type="hidden" name="next" value=next />
                <label for="current">"Current password"</label>
                <input id="current" name="current" type="password" autocomplete="current-password" required autofocus />
                <label for="new">"New password"</label>
                <input id="new" name="new" type="password" autocomplete="new-password" minlength="12" maxlength="256" required />
                <label for="confirm">"New password again"</label>
                <input id="confirm" name="confirm" type="password" autocomplete="new-password" minlength="12" maxlength="256" required />
                <button type="submit" class="primary">"Change password"</button>
            </form>
            <form method="post" action="/logout" class="login-aside">
                <button type="submit" class="link">"Sign out"</button>
            </form>
        </main>
    }
}
