//! The sign-in page. A plain HTML form posting to `/login`, so signing in
//! works before (and without) hydration.

use leptos::prelude::*;
use leptos_router::hooks::use_query_map;

#[component]
pub fn LoginPage() -> impl IntoView {
    let query = use_query_map();
    let error = move || {
        query.with(|q| match q.get("error").as_deref() {
            Some("limited") => {
                Some("Too many failed sign-ins from here. Wait a minute, then try again.")
            }
            Some("origin") => Some("That sign-in came from another site and was refused."),
            Some(_) => Some("That name and password do not match. Try again."),
            None => None,
        })
    };
    let next = move || query.with(|q| q.get("next").unwrap_or_default());
    view! {
        <main class="login">
            <form method="post" action="/login" class="card login-card">
                <h1>"Crewlet node"</h1>
                <p class="muted">"Sign in to watch and steer this fleet."</p>
                {move || error().map(|e| view! { <p class="notice notice-error" role="alert">{e}</p> })}
                <input type="hidden" name="next" value=next />
                <label for="name">"Name"</label>
                <input id="name" name="name" type="text" autocomplete="username" required autofocus />
                <label for="password">"Password"</label>
                <input id="password" name="password" type="password" autocomplete="current-password" required />
                <button type="submit" class="primary">"Sign in"</button>
            </form>
        </main>
    }
}
