//! The sign-in gate's pure parts: outcomes, addresses, redirects, the
//! cross-site check and generated passwords.

use super::forms::sign_in_outcome;
use super::*;

#[test]
fn sign_in_attempts_are_counted_by_outcome() {
    let limited: Result<SignIn, ()> = Ok(SignIn::Limited {
        retry_after: std::time::Duration::from_secs(1),
        audit: false,
    });
    assert_eq!(sign_in_outcome(&limited), "limited");
    assert_eq!(sign_in_outcome::<()>(&Ok(SignIn::Refused)), "refused");
    assert_eq!(sign_in_outcome::<()>(&Ok(SignIn::Busy)), "busy");
    assert_eq!(sign_in_outcome::<()>(&Err(())), "failed");
}

fn h(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut m = HeaderMap::new();
    for (k, v) in pairs {
        m.insert(
            axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    m
}

#[test]
fn same_origin_requests_pass_the_cross_site_check() {
    assert!(!cross_site(&h(&[("sec-fetch-site", "same-origin")])));
    assert!(!cross_site(&h(&[
        ("origin", "http://127.0.0.1:3000"),
        ("host", "127.0.0.1:3000")
    ])));
    assert!(
        !cross_site(&h(&[])),
        "a script without Origin is not a browser"
    );
}

#[test]
fn other_sites_fail_the_cross_site_check() {
    assert!(cross_site(&h(&[("sec-fetch-site", "cross-site")])));
    assert!(cross_site(&h(&[("sec-fetch-site", "same-site")])));
    assert!(cross_site(&h(&[
        ("origin", "http://evil.example"),
        ("host", "127.0.0.1:3000")
    ])));
    assert!(cross_site(&h(&[
        ("origin", "null"),
        ("host", "127.0.0.1:3000")
    ])));
}

#[test]
fn redirect_after_sign_in_stays_on_this_site() {
    assert_eq!(local_path("/seats"), "/seats");
    assert_eq!(local_path("/seats?q=a%20b&page=2"), "/seats?q=a%20b&page=2");
    for bad in [
        "//evil.example/x",
        "https://evil.example",
        "",
        "seats",
        // A tab, a newline or a space lets a browser read `//` (the
        // tab is what `next=/%09/host` decodes to).
        "/\t/127.0.0.1:3999/phish",
        "/\n/evil.example",
        "/\r\nSet-Cookie: x=1",
        "/ /evil.example",
        "/\u{7f}/evil.example",
        "/\\evil.example",
        "/\\/evil.example",
        "/\0",
        "/login",
        "/login?next=/x",
    ] {
        assert_eq!(local_path(bad), HOME, "{bad:?}");
    }
}

#[test]
fn the_client_is_the_peer_unless_a_trusted_proxy_names_it() {
    let trusted = [Network::parse("10.0.0.0/8").unwrap()];
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    // An untrusted peer's header is ignored: anyone can write one.
    assert_eq!(
        client_address(ip("203.0.113.9"), Some("1.2.3.4"), &trusted),
        ip("203.0.113.9")
    );
    assert_eq!(
        client_address(ip("10.0.0.2"), Some("198.51.100.7"), &trusted),
        ip("198.51.100.7")
    );
    // The nearest untrusted hop wins over what the client claimed.
    assert_eq!(
        client_address(
            ip("10.0.0.2"),
            Some("1.2.3.4, 198.51.100.7, 10.0.0.3"),
            &trusted
        ),
        ip("198.51.100.7")
    );
    assert_eq!(
        client_address(ip("10.0.0.2"), None, &trusted),
        ip("10.0.0.2")
    );
    assert_eq!(
        client_address(ip("10.0.0.2"), Some("garbage"), &trusted),
        ip("10.0.0.2")
    );
}

#[test]
fn generated_passwords_are_long_and_distinct() {
    let a = random_password();
    assert_eq!(a.len(), 20);
    assert_ne!(a, random_password());
}
