//! The security headers every answer carries: the dashboard cannot be
//! framed by another site (CSP `frame-ancestors 'none'`, `X-Frame-Options:
//! DENY`), nothing is sniffed into another type, no address leaks to other
//! sites in a `Referer`, and what the JSON and query endpoints answer is
//! never stored by a cache (`Cache-Control: no-store`).

use axum::extract::Request;
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::Response;

/// Whether a path answers data a cache must not keep: the JSON API, the
/// query endpoints, the health and metrics reads, and the sign-in forms.
pub fn no_store(path: &str) -> bool {
    path.starts_with("/api/")
        || path.starts_with("/query/")
        || matches!(path, "/health" | "/metrics" | "/login" | "/logout")
        || path.starts_with("/account/")
}

/// Add the headers to every answer (a handler's own value is kept).
pub async fn secure(req: Request, next: Next) -> Response {
    let store = no_store(req.uri().path());
    let mut res = next.run(req).await;
    let h = res.headers_mut();
    for (name, value) in [
        (
            header::CONTENT_SECURITY_POLICY,
            "frame-ancestors 'none'; base-uri 'self'; form-action 'self'",
        ),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "same-origin"),
    ] {
        h.entry(name).or_insert(HeaderValue::from_static(value));
    }
    if store {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_query_and_sign_in_answers_are_never_stored_and_the_bundle_may_be() {
        for p in [
            "/api/events",
            "/api/seats/a/inbox",
            "/query/fleet",
            "/health",
            "/login",
        ] {
            assert!(no_store(p), "{p}");
        }
        for p in ["/pkg/crewlet.js", "/favicon.ico", "/settings/nodes"] {
            assert!(!no_store(p), "{p}");
        }
    }
}
