//! `GET /metrics` as Prometheus reads it: the families an operator alerts
//! on move as the node works (claims, turns, deliveries, requests,
//! sign-ins), the exposition passes `promtool check metrics`, and the
//! alert rules in docs/monitoring load (`promtool check rules`).
//!
//! Needs `promtool` (Debian's `prometheus` package; `./dev test` installs
//! it) — or `PROMTOOL` naming one.

mod support;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use support::http_node::{HttpNode, OPS_TOKEN, client};
use tokio::io::AsyncWriteExt;

fn promtool() -> PathBuf {
    if let Ok(p) = std::env::var("PROMTOOL") {
        return PathBuf::from(p);
    }
    let p = PathBuf::from("/usr/bin/promtool");
    assert!(
        p.exists(),
        "promtool is not installed: run ./dev deps (Debian's prometheus package) or set PROMTOOL"
    );
    p
}

async fn scrape(n: &HttpNode) -> String {
    let r = client().get(n.url("/metrics")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    r.text().await.unwrap()
}

/// The value of the series whose line starts with `name{` and carries
/// every one of `labels` (`key="value"`), summed over the matches.
fn value(body: &str, name: &str, labels: &[&str]) -> f64 {
    body.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn the_families_an_operator_alerts_on_move_as_the_node_works_and_pass_promtool() {
    let n = HttpNode::start().await;
    let before = scrape(&n).await;
    // Mail to the seat: a turn, its delivery acknowledged.
    let r = client()
        .post(n.url("/api/seats/alpha/inbox"))
        .bearer_auth(OPS_TOKEN)
        .body(r#"{"id": "m-1", "type": "task_assigned", "body": {"text": "count me"}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // A wrong password.
    let r = client()
        .post(n.url("/login"))
        .form(&[("name", "olivia"), ("password", "wrong"), ("next", "/")])
        .send()
        .await
        .unwrap();
    assert!(r.status().is_redirection());
    let after = support::wait_for(
        "the turn counted in crewlet_turns_total",
        Duration::from_secs(20),
        Duration::from_millis(50),
        || async {
            let body = scrape(&n).await;
            (value(&body, "crewlet_turns_total", &[r#"outcome="completed""#])
                > value(&before, "crewlet_turns_total", &[r#"outcome="completed""#]))
            .then_some(body)
        },
    )
    .await;
    let node = r#"node="node-http""#;
    assert!(
        value(&after, "crewlet_claims_total", &[r#"outcome="won""#, node]) >= 1.0,
        "{after}"
    );
    assert!(
        value(
            &after,
            "crewlet_deliveries_total",
            &[r#"disposition="ack""#]
        ) > value(
            &before,
            "crewlet_deliveries_total",
            &[r#"disposition="ack""#]
        ),
        "{after}"
    );
    assert!(
        value(&after, "crewlet_turn_duration_seconds_count", &[]) >= 1.0,
        "{after}"
    );
    assert!(
        value(&after, "crewlet_turn_rounds_count", &[]) >= 1.0,
        "{after}"
    );
    assert!(
        value(&after, "crewlet_sign_ins_total", &[r#"outcome="refused""#]) >= 1.0,
        "{after}"
    );
    assert!(
        value(
            &after,
            "crewlet_http_requests_total",
            &[r#"route="/api/seats/{handle}/inbox""#, r#"status="200""#]
        ) >= 1.0,
        "{after}"
    );
    assert!(
        value(&after, "crewlet_seats_held", &[node]) >= 1.0,
        "{after}"
    );
    assert_eq!(value(&after, "crewlet_up", &[node]), 1.0, "{after}");
    assert!(
        after.contains("# TYPE crewlet_turn_duration_seconds histogram"),
        "{after}"
    );
    assert!(after.contains("# HELP crewlet_claims_total "), "{after}");

    // promtool reads it without a complaint.
    let mut check = tokio::process::Command::new(promtool())
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool runs");
    let mut stdin = check.stdin.take().unwrap();
    stdin.write_all(after.as_bytes()).await.unwrap();
    drop(stdin);
    let out = check.wait_with_output().await.unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty(),
        "promtool check metrics: {}{}\n{after}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    n.stop().await;
}

#[test]
fn the_recommended_alert_rules_load_in_prometheus() {
    let rules =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/monitoring/crewlet-rules.yml");
    let out = std::process::Command::new(promtool())
        .args(["check", "rules"])
        .arg(&rules)
        .output()
        .expect("promtool runs");
    assert!(
        out.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("5 rules found"));
}
