//! The dashboard's small charts: bars and a line with a dot a point, as
//! server-rendered SVG in the chart's own units (the shapes are the pure
//! functions of `view::chart`).

use leptos::prelude::*;

use crate::view::{bars, dots, line_points};

/// A bar a value, the tallest `height` high.
#[component]
pub fn BarChart(
    values: Vec<u64>,
    width: f64,
    height: f64,
    label: &'static str,
    #[prop(optional)] class: &'static str,
) -> impl IntoView {
    view! {
        <svg class=format!("chart {class}") viewBox=format!("0 0 {width} {height}") preserveAspectRatio="none" role="img" aria-label=label>
            {bars(&values, width, height)
                .into_iter()
                .map(|b| view! { <rect x=b.x y=b.y width=b.w height=b.h class="bar" /> })
                .collect_view()}
        </svg>
    }
}

/// A line through the values that are some, a dot on each.
#[component]
pub fn LineChart(
    values: Vec<Option<u64>>,
    width: f64,
    height: f64,
    label: &'static str,
    #[prop(optional)] class: &'static str,
    #[prop(default = 2.0)] dot: f64,
) -> impl IntoView {
    let points = line_points(&values, width, height);
    view! {
        <svg class=format!("chart {class}") viewBox=format!("0 0 {width} {height}") preserveAspectRatio="none" role="img" aria-label=label>
            <polyline points=points class="line" />
            {dots(&values, width, height)
                .into_iter()
                .map(|(x, y)| view! { <circle cx=x cy=y r=dot class="dot" /> })
                .collect_view()}
        </svg>
    }
}
