//! One component for every time a page shows ([`When`]), and the switch
//! between the browser's clock and UTC ([`ClockSwitch`]), remembered per
//! browser (`localStorage` key [`CLOCK_KEY`]).
//!
//! The node renders the UTC time (`14:03:07 UTC`); once the page is
//! hydrated the same element reads relative on the browser's clock
//! (`crate::view::when`), kept current every [`TICK_SECS`] seconds.

use leptos::prelude::*;

#[cfg(feature = "hydrate")]
use crate::view::{Clock, when};

/// Where the choice of clock is remembered: `utc` or `local`.
pub const CLOCK_KEY: &str = "crewlet.clock";
/// How often relative times are brought up to date.
pub const TICK_SECS: u64 = 15;

/// The page's clock: whether times show on UTC, and a tick that moves
/// relative times on.
#[derive(Clone, Copy)]
pub struct Times {
    pub utc: RwSignal<bool>,
    /// Unix seconds now (0 before hydration).
    pub now: RwSignal<f64>,
}

impl Times {
    /// The page's clock from context, or a new one (provided) when none.
    pub fn get() -> Times {
        if let Some(t) = use_context::<Times>() {
            return t;
        }
        let t = Times {
            utc: RwSignal::new(false),
            now: RwSignal::new(0.0),
        };
        provide_context(t);
        #[cfg(feature = "hydrate")]
        Effect::new(move |_| {
            t.utc.set(stored_utc());
            t.now.set(js_sys::Date::now() / 1000.0);
            if let Ok(h) = set_interval_with_handle(
                move || t.now.set(js_sys::Date::now() / 1000.0),
                std::time::Duration::from_secs(TICK_SECS),
            ) {
                on_cleanup(move || h.clear());
            }
        });
        t
    }
}

#[cfg(feature = "hydrate")]
fn storage() -> Option<web_sys::Storage> {
    web_sys::window()?.local_storage().ok()?
}

#[cfg(feature = "hydrate")]
fn stored_utc() -> bool {
    storage()
        .and_then(|s| s.get_item(CLOCK_KEY).ok().flatten())
        .is_some_and(|v| v == "utc")
}

#[cfg(feature = "hydrate")]
fn browser_clock(now: f64, utc: bool) -> Clock {
    let offset = -(js_sys::Date::new_0().get_timezone_offset() as i32);
    let zone = js_sys::Intl::DateTimeFormat::new(&js_sys::Array::new(), &js_sys::Object::new())
        .resolved_options();
    let zone = js_sys::Reflect::get(&zone, &"timeZone".into())
        .ok()
        .and_then(|z| z.as_string())
        .unwrap_or_default();
    Clock {
        now,
        offset_minutes: offset,
        zone,
        utc,
    }
}

/// What the node renders before the browser takes over (and what the
/// browser first hydrates): `14:03:07 UTC` (the full time is on hover).
fn rendered(at: &str) -> String {
    match at.get(11..19) {
        Some(t) => format!("{t} UTC"),
        None => at.to_string(),
    }
}

/// A moment (RFC 3339, UTC) as a person reads it: relative today, the
/// date otherwise, the absolute time and zone on hover.
#[component]
pub fn When(#[prop(into)] at: String) -> impl IntoView {
    let times = Times::get();
    let first = rendered(&at);
    let words = {
        let at = at.clone();
        Memo::new(move |_| {
            let now = times.now.get();
            if now == 0.0 {
                return None;
            }
            #[cfg(feature = "hydrate")]
            {
                when(&at, &browser_clock(now, times.utc.get()))
            }
            #[cfg(not(feature = "hydrate"))]
            {
                let _ = (&at, times.utc.get());
                None::<(String, String)>
            }
        })
    };
    let shown = {
        let first = first.clone();
        move || words.get().map(|w| w.0).unwrap_or_else(|| first.clone())
    };
    let hover = {
        let at = at.clone();
        move || words.get().map(|w| w.1).unwrap_or_else(|| at.clone())
    };
    view! { <time class="when" datetime=at.clone() title=hover>{shown}</time> }
}

/// The switch between the browser's clock and UTC, remembered per browser.
#[component]
pub fn ClockSwitch() -> impl IntoView {
    let times = Times::get();
    view! {
        <button
            type="button"
            class="clock-switch"
            aria-pressed=move || times.utc.get().to_string()
            title="Show times on UTC or on this browser's clock"
            on:click=move |_| {
                let utc = !times.utc.get_untracked();
                times.utc.set(utc);
                #[cfg(feature = "hydrate")]
                if let Some(s) = storage() {
                    let _ = s.set_item(CLOCK_KEY, if utc { "utc" } else { "local" });
                }
            }
        >
            {move || if times.utc.get() { "Times: UTC" } else { "Times: local" }}
        </button>
    }
}
