//! `GET /metrics` as Prometheus reads it: the families an operator alerts
//! on move as the node works (claims, turns, deliveries, requests,
//! sign-ins), the exposition passes `promtool check metrics`, and the
//! alert rules in docs/monitoring load (`promtool check rules`).
//!
//! A real Prometheus server scrapes a two-node fleet on a real nats-server
//! and sees the claim, turn and delivery counters move as mail is sent and
//! a node is killed.
//!
//! Needs `promtool` and `prometheus` (Debian's `prometheus` package; `./dev
//! test` installs it) — or `PROMTOOL` / `PROMETHEUS` naming them.
//!
//! Its own test binary, not a module of `it/`: one process is one node to
//! the metrics recorder (the `node` label is the first node's), so these
//! tests share their process with no other suite's nodes.

#[path = "it/support/mod.rs"]
mod support;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use support::http_node::{HttpNode, MONITORING_TOKEN, OPS_TOKEN, client};
use tokio::io::AsyncWriteExt;

/// The Debian `prometheus` package's `program`, or the one `var` names.
fn installed(var: &str, program: &str) -> PathBuf {
    if let Ok(p) = std::env::var(var) {
        return PathBuf::from(p);
    }
    let p = PathBuf::from("/usr/bin").join(program);
    assert!(
        p.exists(),
        "{program} is not installed: run ./dev deps (Debian's prometheus package) or set {var}"
    );
    p
}

fn promtool() -> PathBuf {
    installed("PROMTOOL", "promtool")
}

async fn scrape(n: &HttpNode) -> String {
    let r = client()
        .get(n.url("/metrics"))
        .bearer_auth(MONITORING_TOKEN)
        .send()
        .await
        .unwrap();
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

/// Scrape `n` until `what` holds of the exposition (20 s at most).
async fn scrape_until(n: &HttpNode, what: &str, ok: impl Fn(&str) -> bool) -> String {
    support::wait_for(
        what,
        Duration::from_secs(20),
        Duration::from_millis(50),
        || async {
            let body = scrape(n).await;
            ok(&body).then_some(body)
        },
    )
    .await
}

#[tokio::test]
async fn inbox_depth_renewals_sweeps_memory_tool_calls_and_reads_move_as_a_seat_works() {
    // A fast node: sweeps, heartbeats and memory flushes every second;
    // seat `beta` is this test's own (the recorder is the process's).
    let n = HttpNode::start_with(
        r#"
[[roles]]
handle = "beta"
agent = { kind = "echo", drills = true }

[coordination]
lease_ttl_seconds = 3
heartbeat_seconds = 1
sweep_seconds = 1

[memory]
flush_seconds = 1
"#,
    )
    .await;
    let send = |id: &'static str, body: &'static str| {
        let url = n.url("/api/seats/beta/inbox");
        async move {
            let r = client()
                .post(url)
                .bearer_auth(OPS_TOKEN)
                .body(format!(
                    r#"{{"id": "{id}", "type": "task_assigned", "body": {body}}}"#
                ))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
        }
    };
    let beta = r#"seat="beta""#;
    // Held, renewed, swept; its memory hydrated as it was established.
    let body = scrape_until(&n, "beta held and renewed", |b| {
        value(b, "crewlet_renewals_total", &[r#"outcome="renewed""#]) >= 1.0
            && value(b, "crewlet_seat_inbox_depth_messages", &[beta]) == 0.0
            && b.contains(r#"crewlet_seat_inbox_depth_messages{"#)
    })
    .await;
    assert!(
        value(&body, "crewlet_sweep_duration_seconds_count", &[]) >= 1.0,
        "{body}"
    );
    assert!(
        value(&body, "crewlet_sweep_claims_count", &[]) >= 1.0,
        "{body}"
    );
    assert!(
        value(
            &body,
            "crewlet_memory_hydrations_total",
            &[r#"outcome="ok""#]
        ) >= 1.0,
        "{body}"
    );
    assert!(
        value(&body, "crewlet_claims_total", &[r#"outcome="won""#]) >= 2.0,
        "{body}"
    );

    // Paused, its mail waits: the inbox depth is read on the sweep's
    // cadence, per seat for a company this small.
    let r = client()
        .post(n.url("/api/seats/beta/pause"))
        .bearer_auth(OPS_TOKEN)
        .json(&serde_json::json!({"reason": "hold the mail"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    send("w-1", r#"{"text": "one"}"#).await;
    send("w-2", r#"{"text": "two"}"#).await;
    send("w-3", r#"{"text": "three"}"#).await;
    scrape_until(
        &n,
        "beta's three waiting messages in its inbox depth",
        |b| value(b, "crewlet_seat_inbox_depth_messages", &[beta]) >= 3.0,
    )
    .await;

    // Resumed, they run: the depth falls back to 0; a turn's answer is a
    // post_outbox call; a call of a tool nobody gave the seat is
    // counted as `unknown`, refused.
    let r = client()
        .post(n.url("/api/seats/beta/resume"))
        .bearer_auth(OPS_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    send(
        "w-4",
        r#"{"text": "four", "tools": [{"name": "made_up_tool"}]}"#,
    )
    .await;
    let body = scrape_until(
        &n,
        "beta's inbox emptied and its turns' calls counted",
        |b| {
            value(b, "crewlet_seat_inbox_depth_messages", &[beta]) == 0.0
                && value(
                    b,
                    "crewlet_tool_calls_total",
                    &[r#"tool="unknown""#, r#"outcome="refused""#],
                ) >= 1.0
        },
    )
    .await;
    assert!(
        value(
            &body,
            "crewlet_tool_calls_total",
            &[r#"tool="post_outbox""#, r#"outcome="ok""#]
        ) >= 1.0,
        "{body}"
    );
    // The echo agent's diary rows are flushed to the changelog.
    scrape_until(&n, "a memory flush that published rows", |b| {
        value(b, "crewlet_memory_flushed_rows_total", &[]) >= 1.0
            && value(b, "crewlet_memory_flushes_total", &[r#"outcome="ok""#]) >= 1.0
    })
    .await;

    // A read of the seat's memory is counted by its answer.
    let r = client()
        .get(n.url("/api/seats/beta/memory"))
        .bearer_auth(MONITORING_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    scrape_until(&n, "a memory read answered by the holder", |b| {
        value(b, "crewlet_memory_reads_total", &[r#"answer="held""#]) >= 1.0
    })
    .await;
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

/// A fleet node's company file: four echo seats on the fleet's NATS, the
/// shortest timings, an operator token to send mail with.
fn fleet_node(id: &str, nats: &str) -> String {
    use sha2::Digest;
    let roles: String = ["s0", "s1", "s2", "s3"]
        .iter()
        .map(|h| format!("[[roles]]\nhandle = \"{h}\"\n"))
        .collect();
    format!(
        "[node]\nid = \"{id}\"\nlisten = \"{{listen}}\"\ndata_dir = \"{{data}}\"\n\n\
         [coordination]\ntype = \"embedded-kv\"\nlease_ttl_seconds = 3\nheartbeat_seconds = 1\nsweep_seconds = 1\n\n\
         [stream]\ntype = \"nats\"\nurls = [\"{nats}\"]\n\n\
         [company]\nname = \"Monitored company\"\n\n{roles}\n\
         [[auth.tokens]]\nname = \"ops\"\nsha256 = \"{}\"\nrole = \"operator\"\n",
        hex::encode(sha2::Sha256::digest(OPS_TOKEN.as_bytes()))
    )
}

/// A Prometheus server scraping `targets` every second, killed on drop.
struct Prometheus {
    child: std::process::Child,
    base: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    async fn start(targets: &[u16]) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let port = support::free_port();
        let list: Vec<String> = targets
            .iter()
            .map(|p| format!("\"127.0.0.1:{p}\""))
            .collect();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: crewlet\n    authorization:\n      credentials: {:?}\n    static_configs:\n      - targets: [{}]\n",
                OPS_TOKEN,
                list.join(", ")
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = std::process::Command::new(installed("PROMETHEUS", "prometheus"))
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("prometheus runs");
        let p = Prometheus {
            child,
            base: format!("http://127.0.0.1:{port}"),
            _dir: dir,
        };
        let ready = format!("{}/-/ready", p.base);
        support::wait_for(
            "Prometheus to be ready",
            Duration::from_secs(30),
            Duration::from_millis(100),
            || {
                let ready = ready.clone();
                async move {
                    reqwest::get(ready)
                        .await
                        .ok()
                        .filter(|r| r.status() == 200)
                        .map(|_| ())
                }
            },
        )
        .await;
        p
    }

    /// An instant query's samples: (labels, value).
    async fn query(&self, q: &str) -> Vec<(serde_json::Value, f64)> {
        let Ok(r) = client()
            .get(format!("{}/api/v1/query", self.base))
            .query(&[("query", q)])
            .send()
            .await
        else {
            return Vec::new();
        };
        let v: serde_json::Value = r.json().await.unwrap_or_default();
        v["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|s| {
                let value = s["value"][1].as_str()?.parse::<f64>().ok()?;
                Some((s["metric"].clone(), value))
            })
            .collect()
    }

    /// Wait until query `q`'s first sample passes `ok`; its value.
    async fn until(&self, what: &str, q: &str, ok: impl Fn(f64) -> bool) -> f64 {
        support::wait_for(
            what,
            Duration::from_secs(60),
            Duration::from_millis(250),
            || async {
                self.query(q)
                    .await
                    .first()
                    .map(|(_, v)| *v)
                    .filter(|v| ok(*v))
            },
        )
        .await
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_sees_claims_turns_and_deliveries_move_on_a_two_node_fleet() {
    use support::process::NodeProcess;
    let nats = support::nats::NatsServer::start().await;
    let a = NodeProcess::start(&fleet_node("node-a", &nats.url()));
    a.healthy(Duration::from_secs(30)).await;
    let mut b = NodeProcess::start(&fleet_node("node-b", &nats.url()));
    b.healthy(Duration::from_secs(30)).await;
    let prom = Prometheus::start(&[a.port, b.port]).await;

    // Both nodes claimed seats, as Prometheus scraped them.
    support::wait_for(
        "claims won by both nodes in Prometheus",
        Duration::from_secs(60),
        Duration::from_millis(250),
        || async {
            (prom
                .query(r#"sum by (node) (crewlet_claims_total{job="crewlet",outcome="won"})"#)
                .await
                .len()
                == 2)
                .then_some(())
        },
    )
    .await;

    // Mail to every seat: four turns, four deliveries acknowledged.
    for (i, seat) in ["s0", "s1", "s2", "s3"].iter().enumerate() {
        let r = client()
            .post(a.url(&format!("/api/seats/{seat}/inbox")))
            .bearer_auth(OPS_TOKEN)
            .body(format!(
                r#"{{"id": "p-{i}", "type": "task_assigned", "body": {{}}}}"#
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    prom.until(
        "four completed turns in Prometheus",
        r#"sum(crewlet_turns_total{outcome="completed"})"#,
        |v| v >= 4.0,
    )
    .await;
    prom.until(
        "four acknowledged deliveries in Prometheus",
        r#"sum(crewlet_deliveries_total{disposition="ack"})"#,
        |v| v >= 4.0,
    )
    .await;
    prom.until(
        "the store's latency in Prometheus",
        r#"sum(crewlet_store_call_duration_seconds_count{node="node-b"})"#,
        |v| v > 0.0,
    )
    .await;

    // Node B dies: Prometheus sees it down, and node A claims its seats.
    let a_claims = prom
        .until(
            "node A's claims",
            r#"sum(crewlet_claims_total{node="node-a",outcome="won"})"#,
            |v| v >= 1.0,
        )
        .await;
    b.kill9();
    prom.until(
        "node B down in Prometheus",
        &format!(r#"up{{instance="127.0.0.1:{}"}}"#, b.port),
        |v| v == 0.0,
    )
    .await;
    prom.until(
        "node A claiming node B's seats",
        r#"sum(crewlet_claims_total{node="node-a",outcome="won"})"#,
        |v| v > a_claims,
    )
    .await;
}
