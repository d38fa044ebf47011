//! One module per dashboard page, and the link grammar the list pages share
//! (filters and page number in the query string).

pub mod audit;
pub mod dead_letters;
pub mod events;
pub mod login;
pub mod memory;
pub mod node;
pub mod node_order;
pub mod node_trends;
pub mod nodes;
pub mod people;
pub mod seat;
pub mod seats;

/// A list page's link: `path` with each non-empty filter (`name`, value) in
/// order, then the page number when past the first, percent-encoded.
pub fn page_href(path: &str, filters: &[(&str, &str)], page: u32) -> String {
    let mut params: Vec<String> = filters
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| format!("{k}={}", encode(v)))
        .collect();
    if page > 1 {
        params.push(format!("page={page}"));
    }
    if params.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{}", params.join("&"))
    }
}

/// The `page` query parameter: 1 when absent or not a number.
pub fn page_param(q: &leptos_router::params::ParamsMap) -> u32 {
    q.get("page")
        .and_then(|p| p.parse::<u32>().ok())
        .unwrap_or(1)
}

/// Percent-encoding of everything outside RFC 3986's unreserved set.
pub fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_link_carries_non_empty_filters_in_order_and_the_page_past_the_first() {
        assert_eq!(
            page_href("/seats", &[("q", ""), ("state", "")], 1),
            "/seats"
        );
        assert_eq!(
            page_href("/memory", &[("seat", "a b"), ("q", "x&y")], 2),
            "/memory?seat=a%20b&q=x%26y&page=2"
        );
        assert_eq!(
            page_href("/seats", &[("q", ""), ("state", "paused")], 3),
            "/seats?state=paused&page=3"
        );
    }
}
