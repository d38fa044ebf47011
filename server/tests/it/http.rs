//! The node's HTTP surface against a real node in this process: `/health`,
//! the sign-in gate, roles, bearer tokens, cross-site refusal, the rate
//! limit and the session cookie, the seat list, a seat's memory and the
//! fleet's alarms.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use crewlet::config::Config;
use crewlet::node;
use reqwest::StatusCode;
use serde_json::Value;

use support::http_node::{
    DEPLOY_TOKEN, HttpNode as TestNode, MONITORING_TOKEN as TOKEN, OPS_TOKEN, client, location,
};

async fn sign_in(
    n: &TestNode,
    c: &reqwest::Client,
    name: &str,
    password: &str,
) -> reqwest::Response {
    c.post(n.url("/login"))
        .form(&[("name", name), ("password", password), ("next", "/seats")])
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn health_answers_liveness_to_anyone_and_the_nodes_detail_to_a_token_only() {
    let n = TestNode::start().await;
    let r = client().get(n.url("/health")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        v,
        serde_json::json!({"status": "ok"}),
        "no seats, no errors"
    );
    let r = client()
        .get(n.url("/health"))
        .bearer_auth("not-a-token")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = client()
        .get(n.url("/health"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["node"], "node-http");
    assert!(v["incarnation"].as_str().unwrap().starts_with("node-http:"));
    assert_eq!(v["version"], crewlet::VERSION);
    assert_eq!(v["protocol"], 4);
    assert!(
        v.get("unproven_seconds").is_none(),
        "only present while a seat is stranded"
    );
    // A single node holds every seat of its company: /health lists them.
    wait_for_seats(&n, serde_json::json!(["alpha"])).await;
    n.stop().await;
}

#[tokio::test]
async fn metrics_answer_a_scrape_token_in_prometheus_text_and_nobody_without_one() {
    let n = TestNode::start().await;
    let r = client().get(n.url("/metrics")).send().await.unwrap();
    assert_eq!(
        r.status(),
        StatusCode::UNAUTHORIZED,
        "the tool names are not for anyone"
    );
    let r = client()
        .get(n.url("/metrics"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let body = r.text().await.unwrap();
    assert!(body.contains("crewlet_up{node=\"node-http\"} 1"), "{body}");
    n.stop().await;
}

#[tokio::test]
async fn unsigned_pages_redirect_to_sign_in_and_json_answers_401() {
    let n = TestNode::start().await;
    let c = client();
    let r = c.get(n.url("/settings/nodes")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(location(&r), "/login?next=/settings/nodes");
    for path in ["/seats", "/memory", "/events", "/settings/people"] {
        let r = c.get(n.url(path)).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::SEE_OTHER, "{path}");
    }
    let r = c.get(n.url("/query/fleet")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = c.post(n.url("/api/fleet")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = c.get(n.url("/")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    n.stop().await;
}

#[tokio::test]
async fn sign_in_sets_a_strict_http_only_cookie_and_returns_to_the_page_asked_for() {
    let n = TestNode::start().await;
    let c = client();
    let r = sign_in(&n, &c, "victor", "view-pass").await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(location(&r), "/seats");
    let cookie = r
        .headers()
        .get("set-cookie")
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    assert!(cookie.starts_with("crewlet_session="), "{cookie}");
    assert!(cookie.contains("HttpOnly"), "{cookie}");
    assert!(cookie.contains("SameSite=Strict"), "{cookie}");
    let r = c.get(n.url("/settings/nodes")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let html = r.text().await.unwrap();
    assert!(html.contains("Settings › Nodes"));
    n.stop().await;
}

/// A stopping node does not wait on its clients for ever: a connection
/// that never finishes its request (or an idle keep-alive the client keeps)
/// is cut off `SERVE_DRAIN` after the node stopped listening, and the stop
/// ends. (It once waited on such a connection with no bound: a test whose
/// client still held its pooled connection hung at `stop` for 40 minutes.)
#[tokio::test]
async fn a_client_holding_a_connection_open_cannot_hold_the_nodes_stop_open() {
    use tokio::io::AsyncWriteExt;
    let n = TestNode::start().await;
    let addr = n.base.trim_start_matches("http://").to_string();
    let mut held = tokio::net::TcpStream::connect(&addr).await.unwrap();
    // Half a request: the server is reading it when the stop comes.
    held.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n")
        .await
        .unwrap();
    // And a pooled keep-alive from a client that stays in scope.
    let c = client();
    let r = c.get(n.url("/health")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let bound = node::SERVE_DRAIN * 12;
    assert!(
        tokio::time::timeout(bound, n.stop()).await.is_ok(),
        "the stop was still waiting on the open connections after {bound:?}"
    );
    drop((held, c));
}

#[tokio::test]
async fn signing_in_again_cycles_the_session_id() {
    let n = TestNode::start().await;
    let c = client();
    let first = sign_in(&n, &c, "victor", "view-pass").await;
    let old = first.headers().get("set-cookie").unwrap().to_str().unwrap();
    let old_id = old.split(';').next().unwrap().to_string();
    let second = sign_in(&n, &c, "olivia", "op-pass").await;
    let new = second
        .headers()
        .get("set-cookie")
        .unwrap()
        .to_str()
        .unwrap();
    let new_id = new.split(';').next().unwrap().to_string();
    assert_ne!(old_id, new_id, "the session id changes at sign-in");
    // The old id no longer signs anybody in.
    let r = client()
        .get(n.url("/settings/nodes"))
        .header("cookie", old_id)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    n.stop().await;
}

#[tokio::test]
async fn the_database_keeps_no_session_cookie_only_its_hash() {
    let n = TestNode::start().await;
    let c = client();
    let r = sign_in(&n, &c, "olivia", "op-pass").await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let cookie = r.headers().get("set-cookie").unwrap().to_str().unwrap();
    let value = cookie
        .split(';')
        .next()
        .unwrap()
        .trim_start_matches("crewlet_session=")
        .to_string();
    let pool = crewlet::db::open(&n.data_dir(), &crewlet::db::MIGRATOR)
        .await
        .unwrap();
    let ids: Vec<String> = sqlx::query_scalar("SELECT id FROM sessions")
        .fetch_all(&pool)
        .await
        .unwrap();
    pool.close().await;
    assert_eq!(ids.len(), 1, "one session: {ids:?}");
    assert_ne!(ids[0], value, "the cookie itself is kept");
    // What the file holds, used as a cookie, signs nobody in.
    let r = client()
        .get(n.url("/settings/nodes"))
        .header("cookie", format!("crewlet_session={}", ids[0]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    // The cookie itself still does.
    let r = c.get(n.url("/settings/nodes")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    n.stop().await;
}

#[tokio::test]
async fn wrong_password_and_unknown_name_get_the_same_generic_answer() {
    let n = TestNode::start().await;
    let c = client();
    let a = sign_in(&n, &c, "victor", "nope").await;
    let b = sign_in(&n, &c, "nobody", "nope").await;
    assert_eq!(a.status(), StatusCode::SEE_OTHER);
    assert_eq!(location(&a), "/login?error=1&next=/seats&name=victor");
    assert_eq!(location(&b), "/login?error=1&next=/seats&name=nobody");
    assert!(a.headers().get("set-cookie").is_none());
    n.stop().await;
}

#[tokio::test]
async fn repeated_sign_in_failures_are_rate_limited_even_for_the_right_password() {
    let n = TestNode::start().await;
    let c = client();
    for _ in 0..=crewlet::web::auth::limiter::BY_NAME_FROM_ADDRESS.free {
        let r = sign_in(&n, &c, "victor", "nope").await;
        assert_eq!(location(&r), "/login?error=1&next=/seats&name=victor");
    }
    let r = sign_in(&n, &c, "victor", "view-pass").await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(r.headers().get("retry-after").is_some());
    let page = r.text().await.unwrap();
    assert!(page.contains("Too many sign-in attempts"), "{page}");
    assert!(page.contains("Try again in"), "{page}");
    n.stop().await;
}

#[tokio::test]
async fn a_viewer_is_refused_adding_a_person_with_403_and_an_admin_is_not() {
    let n = TestNode::start().await;
    let viewer = client();
    sign_in(&n, &viewer, "victor", "view-pass").await;
    let r = viewer
        .post(n.url("/api/add_person"))
        .form(&[("name", "mallory"), ("role", "viewer")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let body = r.text().await.unwrap();
    assert!(body.contains("only admins may add people"), "{body}");

    let op = client();
    sign_in(&n, &op, "ada", "admin-pass").await;
    let r = op
        .post(n.url("/api/add_person"))
        .form(&[("name", "alice"), ("role", "viewer")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["name"], "alice");
    let password = v["password"].as_str().unwrap().to_string();

    // Both attempts are in the audit log, with their results.
    let r = op.post(n.url("/api/audit_log")).send().await.unwrap();
    let log = support::audit_entries(r.json().await.unwrap());
    let adds: Vec<(&str, &str)> = log
        .iter()
        .filter(|e| e["action"] == "person.add")
        .map(|e| (e["person"].as_str().unwrap(), e["result"].as_str().unwrap()))
        .collect();
    assert_eq!(
        adds,
        vec![("ada", "ok"), ("victor", "refused: not an admin")]
    );

    // The person added signs in with the password shown once, and
    // chooses their own first.
    let alice = client();
    let r = sign_in(&n, &alice, "alice", &password).await;
    assert_eq!(location(&r), "/account/password?next=/seats");
    n.stop().await;
}

#[tokio::test]
async fn adding_a_person_with_a_bad_name_says_which_field_and_why() {
    let n = TestNode::start().await;
    let op = client();
    sign_in(&n, &op, "ada", "admin-pass").await;
    for (name, role, status, says) in [
        ("two words", "viewer", StatusCode::BAD_REQUEST, "Name:"),
        (
            "victor",
            "viewer",
            StatusCode::BAD_REQUEST,
            "can already sign in",
        ),
        (
            "zed",
            "root",
            StatusCode::BAD_REQUEST,
            "use \\\"viewer\\\", \\\"operator\\\" or \\\"admin\\\"",
        ),
    ] {
        let r = op
            .post(n.url("/api/add_person"))
            .form(&[("name", name), ("role", role)])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), status, "{name}");
        let body = r.text().await.unwrap();
        assert!(body.contains(says), "{name}: {body}");
    }
    n.stop().await;
}

#[tokio::test]
async fn cross_site_posts_are_refused() {
    let n = TestNode::start().await;
    // An admin, who may add people: only the cross-site check refuses.
    let op = client();
    sign_in(&n, &op, "ada", "admin-pass").await;
    let r = op
        .post(n.url("/api/add_person"))
        .header("sec-fetch-site", "cross-site")
        .form(&[("name", "eve"), ("role", "operator")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let r = op
        .post(n.url("/api/add_person"))
        .header("origin", "http://evil.example")
        .form(&[("name", "eve"), ("role", "operator")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    // A cross-site sign-in is refused too (login CSRF).
    let r = client()
        .post(n.url("/login"))
        .header("origin", "http://evil.example")
        .form(&[("name", "olivia"), ("password", "op-pass")])
        .send()
        .await
        .unwrap();
    assert_eq!(location(&r), "/login?error=origin");
    // Nothing was added.
    let people: Vec<Value> = op
        .post(n.url("/api/people"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(people.iter().all(|p| p["name"] != "eve"));
    n.stop().await;
}

#[tokio::test]
async fn a_bearer_token_reads_json_endpoints_and_nothing_else() {
    let n = TestNode::start().await;
    let c = client();
    let r = c
        .get(n.url("/query/fleet"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["nodes"][0]["node_id"], "node-http");
    assert_eq!(v["nodes"][0]["protocol"], 4);
    assert_eq!(v["nodes"][0]["roles"], serde_json::json!(["alpha"]));
    assert!(v["nodes"][0]["presence_expires_at"].is_string());
    assert!(v["nodes"][0]["presence_expires_at"].is_string());

    let r = c
        .get(n.url("/query/fleet"))
        .bearer_auth("not-the-token")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    // A token is not a session: pages and server functions still need one.
    let r = c
        .get(n.url("/settings/nodes"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let r = c
        .post(n.url("/api/add_person"))
        .bearer_auth(TOKEN)
        .form(&[("name", "bot"), ("role", "operator")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    n.stop().await;
}

#[tokio::test]
async fn sign_out_ends_the_session() {
    let n = TestNode::start().await;
    let c = client();
    sign_in(&n, &c, "victor", "view-pass").await;
    let r = c.post(n.url("/logout")).send().await.unwrap();
    assert_eq!(location(&r), "/login?signed_out=1");
    let r = c.get(n.url("/settings/nodes")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    n.stop().await;
}

/// A node on `dir/data` with nobody configured and any free port.
fn nobody_configured(dir: &std::path::Path) -> Config {
    let text = format!(
        "[node]\nlisten = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n",
        dir.join("data").display()
    );
    Config::parse("t.toml", &text, &BTreeMap::new()).unwrap()
}

#[tokio::test]
async fn first_start_with_nobody_configured_creates_admin_and_keeps_only_a_hash() {
    let dir = tempfile::tempdir().unwrap();
    let config = nobody_configured(dir.path());
    let node = node::start(config.clone()).await.unwrap();
    node.shutdown().await.unwrap();
    let pool = crewlet::db::open(&dir.path().join("data"), &crewlet::db::MIGRATOR)
        .await
        .unwrap();
    let rows: Vec<(String, String, String)> =
        sqlx::query_as("SELECT name, role, password_hash FROM people")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].0, "admin");
    assert_eq!(rows[0].1, "admin");
    assert!(rows[0].2.starts_with("$argon2id$"), "only the hash is kept");
    pool.close().await;
    // A second start does not create another.
    let node = node::start(config).await.unwrap();
    node.shutdown().await.unwrap();
    let pool = crewlet::db::open(&dir.path().join("data"), &crewlet::db::MIGRATOR)
        .await
        .unwrap();
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM people")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(n, 1);
}

/// A node that has stopped has closed its database: every connection
/// ended, the write-ahead log folded back and removed, so the next start
/// (or a backup, or a person's sqlite3) finds the file whole and nobody
/// still holding it.
#[tokio::test]
async fn a_stopped_node_has_closed_its_database() {
    let dir = tempfile::tempdir().unwrap();
    let node = node::start(nobody_configured(dir.path())).await.unwrap();
    let wal = dir.path().join("data").join("crewlet.db-wal");
    assert!(wal.exists(), "a running node writes through its log");
    node.shutdown().await.unwrap();
    assert!(
        !wal.exists(),
        "the database is still open after the node stopped: {} remains",
        wal.display()
    );
}

/// Run the `crewlet` binary with the operator token in CREWLET_TOKEN.
async fn crewlet_cli(args: &[&str], file: Option<&std::path::Path>) -> std::process::Output {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_crewlet"));
    cmd.args(args).env("CREWLET_TOKEN", DEPLOY_TOKEN);
    if let Some(f) = file {
        cmd.arg(f);
    }
    cmd.output().await.unwrap()
}

async fn health_seats(n: &TestNode) -> Value {
    client()
        .get(n.url("/health"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap()["seats"]
        .clone()
}

async fn wait_for_seats(n: &TestNode, want: Value) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let got = health_seats(n).await;
        if got == want {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "seats stayed {got}, wanted {want}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn an_admin_token_applies_a_company_and_the_new_seat_is_held() {
    let n = TestNode::start().await;
    wait_for_seats(&n, serde_json::json!(["alpha"])).await;
    let file = "[company]\nname = \"Grown\"\n[[roles]]\nhandle = \"alpha\"\n[[roles]]\nhandle = \"beta\"\n";
    let r = client()
        .post(n.url("/api/company"))
        .bearer_auth(DEPLOY_TOKEN)
        .body(file)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["revision"], 2);
    wait_for_seats(&n, serde_json::json!(["alpha", "beta"])).await;
    // Audited under the token's name.
    let log = n.audit_log().await;
    assert!(log.iter().any(|e| e["person"] == "token:deploy"
        && e["action"] == "company.apply"
        && e["reason"] == "revision 2: 2 seats"
        && e["result"] == "ok"));
    n.stop().await;
}

#[tokio::test]
async fn applying_a_company_is_refused_to_viewers_and_bad_files_name_the_key() {
    let n = TestNode::start().await;
    let r = client()
        .post(n.url("/api/company"))
        .bearer_auth(TOKEN)
        .body("[[roles]]\nhandle = \"x\"\n")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let r = client()
        .post(n.url("/api/company"))
        .bearer_auth(DEPLOY_TOKEN)
        .body("[[roles]]\nhandel = \"x\"\n")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let v: Value = r.json().await.unwrap();
    let msg = v["error"].as_str().unwrap();
    assert!(
        msg.contains("roles[0].handel") && msg.contains("`handle`"),
        "{msg}"
    );
    // Nothing changed.
    wait_for_seats(&n, serde_json::json!(["alpha"])).await;
    n.stop().await;
}

#[tokio::test]
async fn crewlet_apply_sends_a_file_to_a_running_node() {
    let n = TestNode::start().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("company.toml");
    std::fs::write(
        &file,
        "[[roles]]\nhandle = \"alpha\"\n[[roles]]\nhandle = \"gamma\"\n",
    )
    .unwrap();
    let out = crewlet_cli(&["apply", "--node", &n.base], Some(&file)).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("revision 2 is active"), "{stdout}");
    wait_for_seats(&n, serde_json::json!(["alpha", "gamma"])).await;
    // A file that does not validate never leaves the machine: exit 2.
    std::fs::write(&file, "[[roles]]\nhandle = \"a.b\"\n").unwrap();
    let out = crewlet_cli(&["apply", "--node", &n.base], Some(&file)).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("roles[0].handle"));
    n.stop().await;
}

#[tokio::test]
async fn dead_letters_can_be_read_with_a_token_and_a_poison_message_shows_up() {
    use crewlet::queue::{Delivery, Disposition, handler_fn};
    let n = TestNode::start().await;
    let engine = n.node.as_ref().unwrap().engine.clone();
    let (status, empty) = viewer_get(&n, "/api/dead-letters").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(empty, serde_json::json!({"letters": [], "total": 0}));
    // A subscription of its own, so the seat's held inbox is untouched.
    let q = engine.queue().clone();
    let spec = crewlet::queue::SubscriptionSpec::new(
        "probe".into(),
        "crewlet.agent.alpha.probe".into(),
        Default::default(),
    );
    q.ensure_subscription(&spec).await.unwrap();
    for id in ["m-1", "m-2"] {
        q.publish(
            &spec.subject,
            Some(id),
            bytes::Bytes::from_static(b"{broken"),
        )
        .await
        .unwrap();
    }
    let refuse = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let r2 = refuse.clone();
    let (tx, mut delivered) = tokio::sync::mpsc::unbounded_channel();
    let a = q
        .attach(
            "probe",
            &[],
            handler_fn(move |d: Delivery| {
                let refuse = r2.load(std::sync::atomic::Ordering::SeqCst);
                let _ = tx.send(d.msg_id.clone());
                async move {
                    if refuse {
                        Disposition::Poison("not an envelope".into())
                    } else {
                        Disposition::Ack
                    }
                }
            }),
        )
        .await
        .unwrap();
    let list = support::wait_for(
        "two dead letters listed",
        std::time::Duration::from_secs(10),
        std::time::Duration::from_millis(20),
        || async {
            let (_, v) = viewer_get(&n, "/api/dead-letters?limit=5").await;
            (v["letters"].as_array().map_or(0, Vec::len) == 2).then_some(v)
        },
    )
    .await;
    assert_eq!(list["total"], 2);
    let newest = &list["letters"][0];
    assert_eq!(newest["subscription"], "probe");
    assert_eq!(newest["msg_id"], "m-2");
    assert_eq!(newest["payload"], "{broken");
    assert!(
        newest["reason"]
            .as_str()
            .unwrap()
            .contains("not an envelope")
    );
    assert!(newest["at"].as_str().is_some_and(|t| t.ends_with('Z')));
    let oldest = list["letters"][1]["id"].as_u64().unwrap();
    let newest = newest["id"].as_u64().unwrap();
    while delivered.try_recv().is_ok() {}

    // A viewer may read them, not act on them; the refusal is audited.
    let r = client()
        .post(n.url(&format!("/api/dead-letters/{oldest}/requeue")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    // An operator re-publishes one: it is delivered again and leaves the list.
    refuse.store(false, std::sync::atomic::Ordering::SeqCst);
    let r = client()
        .post(n.url(&format!("/api/dead-letters/{oldest}/requeue")))
        .bearer_auth(OPS_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let done: Value = r.json().await.unwrap();
    assert_eq!(
        done["result"],
        format!("re-published to crewlet.agent.alpha.probe as m-1~requeued-{oldest}")
    );
    let again = tokio::time::timeout(std::time::Duration::from_secs(10), delivered.recv())
        .await
        .expect("the re-published mail is delivered")
        .unwrap();
    assert_eq!(
        again.as_deref(),
        Some(format!("m-1~requeued-{oldest}").as_str())
    );
    // The other is discarded; neither is there to act on again.
    let r = client()
        .post(n.url(&format!("/api/dead-letters/{newest}/discard")))
        .bearer_auth(OPS_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    for id in [oldest, newest] {
        let r = client()
            .post(n.url(&format!("/api/dead-letters/{id}/discard")))
            .bearer_auth(OPS_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
    }
    let (_, v) = viewer_get(&n, "/api/dead-letters").await;
    assert_eq!(v, serde_json::json!({"letters": [], "total": 0}));
    // Every one of those actions is in the audit log (newest first).
    let mut log: Vec<Value> = n
        .audit_log()
        .await
        .into_iter()
        .filter(|e| {
            e["action"]
                .as_str()
                .is_some_and(|a| a.starts_with("dead_letter."))
        })
        .collect();
    log.reverse();
    let rows: Vec<(&str, &str)> = log
        .iter()
        .map(|e| (e["action"].as_str().unwrap(), e["result"].as_str().unwrap()))
        .collect();
    assert_eq!(rows.len(), 5, "{rows:?}");
    assert_eq!(rows[0], ("dead_letter.requeue", "refused: not an operator"));
    assert_eq!(rows[1].0, "dead_letter.requeue");
    assert!(rows[1].1.starts_with("ok: re-published"), "{rows:?}");
    assert_eq!(rows[2], ("dead_letter.discard", "ok: discarded"));
    assert_eq!(
        rows[3],
        ("dead_letter.discard", "refused: no such dead letter")
    );
    assert_eq!(log[1]["person"], "token:ops");
    a.detach().await;
    n.stop().await;
}

/// The outbound effects the node's turns posted for trigger `id`.
async fn effects_for(n: &TestNode, id: &str) -> usize {
    let turns = n.node.as_ref().unwrap().turns.clone();
    turns
        .outbox()
        .read(None)
        .await
        .unwrap()
        .iter()
        .filter(|e| e.trigger_ids.iter().any(|t| t == id))
        .count()
}

/// Wait until the seat's turn for `id` posted its effect and the inbox is
/// empty.
async fn wait_for_turn(n: &TestNode, handle: &str, id: &str) {
    support::wait_for(
        &format!("the turn for {id} to post its effect and be acknowledged"),
        Duration::from_secs(20),
        Duration::from_millis(20),
        || async {
            (effects_for(n, id).await >= 1 && inbox_pending(n, handle).await == 0).then_some(())
        },
    )
    .await;
}

async fn inbox_pending(n: &TestNode, handle: &str) -> u64 {
    let engine = n.node.as_ref().unwrap().engine.clone();
    engine
        .queue()
        .pending(&crewlet::queue::inbox_group(handle))
        .await
        .unwrap()
}

#[tokio::test]
async fn an_operator_publishes_an_envelope_to_a_seats_inbox_and_its_turn_runs_once() {
    let n = TestNode::start().await;
    wait_for_seats(&n, serde_json::json!(["alpha"])).await;
    let r = client()
        .post(n.url("/api/seats/alpha/inbox"))
        .bearer_auth(DEPLOY_TOKEN)
        .body(r#"{"id":"evt-7","type":"task_assigned","body":{"title":"write the report"}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap()["id"], "evt-7");
    // The seat's echo agent runs it, posts its effect, and it is acked.
    wait_for_turn(&n, "alpha", "evt-7").await;
    // The same id again runs no second turn (deduped at the publish, and
    // the completion ledger holds it besides).
    let again = client()
        .post(n.url("/api/seats/alpha/inbox"))
        .bearer_auth(DEPLOY_TOKEN)
        .body(r#"{"id":"evt-7","type":"task_assigned"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::OK);
    support::wait_for(
        "the copy to be settled",
        Duration::from_secs(20),
        Duration::from_millis(20),
        || async { (inbox_pending(&n, "alpha").await == 0).then_some(()) },
    )
    .await;
    assert_eq!(effects_for(&n, "evt-7").await, 1);
    n.stop().await;
}

#[tokio::test]
async fn a_bad_envelope_or_seat_is_refused_with_the_reason_and_viewers_cannot_send() {
    let n = TestNode::start().await;
    for (seat, body, token, status, says) in [
        (
            "alpha",
            "{not json",
            DEPLOY_TOKEN,
            StatusCode::BAD_REQUEST,
            "not JSON",
        ),
        (
            "alpha",
            r#"{"body":1}"#,
            DEPLOY_TOKEN,
            StatusCode::BAD_REQUEST,
            "type",
        ),
        (
            "alpha",
            r#"{"type":""}"#,
            DEPLOY_TOKEN,
            StatusCode::BAD_REQUEST,
            "`type` must not be empty",
        ),
        (
            "nobody",
            r#"{"type":"task_assigned"}"#,
            DEPLOY_TOKEN,
            StatusCode::BAD_REQUEST,
            "not in the active company",
        ),
        (
            "alpha",
            r#"{"type":"task_assigned"}"#,
            TOKEN,
            StatusCode::FORBIDDEN,
            "only operators",
        ),
    ] {
        let r = client()
            .post(n.url(&format!("/api/seats/{seat}/inbox")))
            .bearer_auth(token)
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), status, "{body}");
        let v: Value = r.json().await.unwrap();
        assert!(v["error"].as_str().unwrap().contains(says), "{body}: {v}");
    }
    n.stop().await;
}

#[tokio::test]
async fn crewlet_send_publishes_one_envelope_through_a_node() {
    let n = TestNode::start().await;
    let out = crewlet_cli(
        &[
            "send",
            "--node",
            &n.base,
            "--seat",
            "alpha",
            "--type",
            "task_assigned",
            "--id",
            "cli-1",
            r#"{"title":"from the command line"}"#,
        ],
        None,
    )
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("sent cli-1 to alpha"), "{stdout}");
    wait_for_turn(&n, "alpha", "cli-1").await;
    let out = crewlet_cli(
        &[
            "send",
            "--node",
            &n.base,
            "--seat",
            "ghost",
            "--type",
            "task_assigned",
            "x",
        ],
        None,
    )
    .await;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not in the active company"));
    n.stop().await;
}

/// The newest audit rows for `action`, oldest first, read by an operator.
async fn audit_rows(n: &TestNode, action: &str) -> Vec<Value> {
    let mut log = n.audit_log().await;
    log.retain(|e| e["action"] == action);
    log.reverse();
    log
}

async fn seat_pause(n: &TestNode, handle: &str) -> Option<crewlet::engine::pause::PauseRecord> {
    let engine = n.node.as_ref().unwrap().engine.clone();
    crewlet::engine::pause::read(&**engine.store(), handle)
        .await
        .unwrap()
}

/// Every event already on `rx` (the console emits before it answers).
fn events_so_far(
    rx: &mut tokio::sync::broadcast::Receiver<crewlet::events::FleetEvent>,
) -> Vec<crewlet::events::Event> {
    let mut out = Vec::new();
    while let Ok(e) = rx.try_recv() {
        out.push(e.event);
    }
    out
}

#[tokio::test]
async fn a_viewer_cannot_pause_and_the_refusal_is_audited() {
    let n = TestNode::start().await;
    let viewer = client();
    sign_in(&n, &viewer, "victor", "view-pass").await;
    let r = viewer
        .post(n.url("/api/seats/alpha/pause"))
        .body(r#"{"reason":"curious","stop_running_turn":true}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let v: Value = r.json().await.unwrap();
    let msg = v["error"].as_str().unwrap();
    assert!(msg.contains("only operators may pause a seat"), "{msg}");
    // A viewer's token is refused the same way.
    let r = client()
        .post(n.url("/api/seats/alpha/pause"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);

    assert_eq!(seat_pause(&n, "alpha").await, None, "nothing was paused");
    let rows = audit_rows(&n, "seat.pause").await;
    let got: Vec<(&str, &str, &str, &str)> = rows
        .iter()
        .map(|e| {
            (
                e["person"].as_str().unwrap(),
                e["seat"].as_str().unwrap(),
                e["reason"].as_str().unwrap_or(""),
                e["result"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("victor", "alpha", "curious", "refused: not an operator"),
            ("token:monitoring", "alpha", "", "refused: not an operator"),
        ]
    );
    n.stop().await;
}

#[tokio::test]
async fn an_operator_pauses_and_resumes_a_seat_and_both_are_audited() {
    use crewlet::events::Event;
    let n = TestNode::start().await;
    let mut events = n.node.as_ref().unwrap().engine.events().subscribe();
    let op = client();
    sign_in(&n, &op, "olivia", "op-pass").await;
    let r = op
        .post(n.url("/api/seats/alpha/pause"))
        .body(r#"{"reason":"  rotating the API keys  "}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        serde_json::json!({"seat": "alpha", "result": "paused"})
    );
    let record = seat_pause(&n, "alpha")
        .await
        .expect("the pause is recorded");
    assert_eq!(record.by, "olivia");
    assert_eq!(record.reason.as_deref(), Some("rotating the API keys"));
    assert!(!record.stop_running_turn);
    assert!(!record.at.is_empty());

    // The resume comes through an operator token.
    let r = client()
        .post(n.url("/api/seats/alpha/resume"))
        .bearer_auth(DEPLOY_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        serde_json::json!({"seat": "alpha", "result": "resumed"})
    );
    assert_eq!(seat_pause(&n, "alpha").await, None, "the pause is gone");

    let ours: Vec<Event> = events_so_far(&mut events)
        .into_iter()
        .filter(|e| matches!(e, Event::SeatPaused { .. } | Event::SeatResumed { .. }))
        .collect();
    assert_eq!(
        ours,
        vec![
            Event::SeatPaused {
                seat: "alpha".into(),
                by: "olivia".into(),
                reason: Some("rotating the API keys".into()),
                stop_running_turn: false,
            },
            Event::SeatResumed {
                seat: "alpha".into(),
                by: "token:deploy".into(),
            },
        ]
    );
    let pauses = audit_rows(&n, "seat.pause").await;
    let resumes = audit_rows(&n, "seat.resume").await;
    assert_eq!(pauses.len(), 1, "{pauses:?}");
    assert_eq!(pauses[0]["person"], "olivia");
    assert_eq!(pauses[0]["seat"], "alpha");
    assert_eq!(pauses[0]["reason"], "rotating the API keys");
    assert_eq!(pauses[0]["result"], "paused");
    assert_eq!(resumes.len(), 1, "{resumes:?}");
    assert_eq!(resumes[0]["person"], "token:deploy");
    assert_eq!(resumes[0]["seat"], "alpha");
    assert_eq!(resumes[0]["result"], "resumed");
    n.stop().await;
}

#[tokio::test]
async fn pausing_a_paused_seat_updates_the_pause_and_resuming_twice_says_it_was_not_paused() {
    let n = TestNode::start().await;
    let pause = |body: &'static str| {
        client()
            .post(n.url("/api/seats/alpha/pause"))
            .bearer_auth(DEPLOY_TOKEN)
            .body(body)
            .send()
    };
    let first: Value = pause("").await.unwrap().json().await.unwrap();
    assert_eq!(first["result"], "paused");
    assert_eq!(seat_pause(&n, "alpha").await.unwrap().reason, None);
    let again: Value = pause(r#"{"reason":"still busy","stop_running_turn":true}"#)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        again["result"],
        "already paused (updated); the running turn stops at its next round"
    );
    let record = seat_pause(&n, "alpha").await.unwrap();
    assert_eq!(record.reason.as_deref(), Some("still busy"));
    assert!(record.stop_running_turn);
    for want in ["resumed", "was not paused"] {
        let v: Value = client()
            .post(n.url("/api/seats/alpha/resume"))
            .bearer_auth(DEPLOY_TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(v["result"], want);
    }
    let results: Vec<Value> = audit_rows(&n, "seat.resume")
        .await
        .into_iter()
        .map(|e| e["result"].clone())
        .collect();
    assert_eq!(
        results,
        vec![
            serde_json::json!("resumed"),
            serde_json::json!("was not paused")
        ]
    );
    n.stop().await;
}

#[tokio::test]
async fn pausing_an_unknown_seat_names_it() {
    let n = TestNode::start().await;
    for action in ["pause", "resume", "stop"] {
        let r = client()
            .post(n.url(&format!("/api/seats/ghost/{action}")))
            .bearer_auth(DEPLOY_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "{action}");
        let v: Value = r.json().await.unwrap();
        let msg = v["error"].as_str().unwrap();
        assert!(
            msg.contains("\"ghost\"") && msg.contains("not in the active company"),
            "{action}: {msg}"
        );
    }
    assert_eq!(seat_pause(&n, "ghost").await, None);
    let rows = audit_rows(&n, "seat.pause").await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["seat"], "ghost");
    assert_eq!(rows[0]["result"], "refused: no such seat");
    n.stop().await;
}

#[tokio::test]
async fn a_malformed_pause_body_is_refused_naming_the_field() {
    let n = TestNode::start().await;
    for (action, body, says) in [
        (
            "pause",
            r#"{"stop_running_turn":"yes"}"#,
            "stop_running_turn:",
        ),
        ("pause", r#"{"reason":7}"#, "reason:"),
        ("pause", r#"{"reasn":"typo"}"#, "reasn:"),
        ("pause", "{not json", "not JSON"),
        ("pause", "[]", "not a JSON object"),
        (
            "stop",
            r#"{"stop_running_turn":true}"#,
            "stop_running_turn:",
        ),
        ("resume", r#"{"reason":"x"}"#, "reason:"),
    ] {
        let r = client()
            .post(n.url(&format!("/api/seats/alpha/{action}")))
            .bearer_auth(DEPLOY_TOKEN)
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{action} {body}");
        let v: Value = r.json().await.unwrap();
        let msg = v["error"].as_str().unwrap();
        assert!(msg.contains(says), "{action} {body}: {msg}");
    }
    let long = "x".repeat(501);
    let r = client()
        .post(n.url("/api/seats/alpha/pause"))
        .bearer_auth(DEPLOY_TOKEN)
        .body(serde_json::json!({ "reason": long }).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let v: Value = r.json().await.unwrap();
    assert!(v["error"].as_str().unwrap().starts_with("reason:"), "{v}");
    assert_eq!(seat_pause(&n, "alpha").await, None, "nothing was paused");
    n.stop().await;
}

#[tokio::test]
async fn stop_is_operator_only_and_audited() {
    use crewlet::events::Event;
    let n = TestNode::start().await;
    let mut events = n.node.as_ref().unwrap().engine.events().subscribe();
    let r = client()
        .post(n.url("/api/seats/alpha/stop"))
        .bearer_auth(TOKEN)
        .body(r#"{"reason":"looping"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("only operators may stop a seat's turn"),
        "{v}"
    );
    let stop = || {
        client()
            .post(n.url("/api/seats/alpha/stop"))
            .bearer_auth(DEPLOY_TOKEN)
            .body(r#"{"reason":"looping"}"#)
            .send()
    };
    // Nothing runs yet: said so, and nothing is sent.
    let r = stop().await.unwrap();
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        serde_json::json!({"seat": "alpha", "result": "no turn was running"})
    );
    // A slow turn (the echo drill's rounds), then the stop reaches it.
    let slow = client()
        .post(n.url("/api/seats/alpha/inbox"))
        .bearer_auth(DEPLOY_TOKEN)
        .body(r#"{"id":"evt-slow","type":"task_assigned","body":{"echo":{"rounds":40,"round_delay_ms":500}}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(slow.status(), StatusCode::OK);
    let turns = n.running().turns.clone();
    support::wait_for(
        "alpha's turn runs",
        Duration::from_secs(20),
        Duration::from_millis(20),
        || {
            let running = turns
                .seats()
                .iter()
                .any(|s| s.handle == "alpha" && s.running_turn.is_some());
            async move { running.then_some(()) }
        },
    )
    .await;
    let r = stop().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        serde_json::json!({"seat": "alpha", "result": "stop requested"})
    );
    let stops: Vec<Event> = events_so_far(&mut events)
        .into_iter()
        .filter(|e| matches!(e, Event::TurnStopRequested { .. }))
        .collect();
    assert_eq!(
        stops,
        vec![Event::TurnStopRequested {
            seat: "alpha".into(),
            by: "token:deploy".into()
        }]
    );
    // A stop is not a pause.
    assert_eq!(seat_pause(&n, "alpha").await, None);
    let rows: Vec<(String, String, String)> = audit_rows(&n, "seat.stop_turn")
        .await
        .iter()
        .map(|e| {
            (
                e["person"].as_str().unwrap().to_string(),
                e["reason"].as_str().unwrap().to_string(),
                e["result"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        vec![
            (
                "token:monitoring".to_string(),
                "looping".to_string(),
                "refused: not an operator".to_string()
            ),
            (
                "token:deploy".to_string(),
                "looping".to_string(),
                "no turn was running".to_string()
            ),
            (
                "token:deploy".to_string(),
                "looping".to_string(),
                "stop requested".to_string()
            ),
        ]
    );
    n.stop().await;
}

#[tokio::test]
async fn crewlet_pause_and_resume_talk_to_the_api() {
    let n = TestNode::start().await;
    for command in ["pause", "resume", "stop"] {
        let out = crewlet_cli(&[command, "--help"], None).await;
        assert_eq!(out.status.code(), Some(0), "{command} --help");
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(
            help.contains("--seat") && help.contains("--token"),
            "{help}"
        );
    }
    let out = crewlet_cli(
        &[
            "pause",
            "--node",
            &n.base,
            "--seat",
            "alpha",
            "--reason",
            "deploying",
            "--stop-running-turn",
        ],
        None,
    )
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.trim(),
        "alpha: paused; the running turn stops at its next round"
    );
    let record = seat_pause(&n, "alpha").await.expect("paused");
    assert_eq!(record.by, "token:deploy");
    assert_eq!(record.reason.as_deref(), Some("deploying"));
    assert!(record.stop_running_turn);

    let out = crewlet_cli(&["resume", "--node", &n.base, "--seat", "alpha"], None).await;
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "alpha: resumed"
    );
    assert_eq!(seat_pause(&n, "alpha").await, None);

    // No turn runs: the node says so (a running turn's stop is the
    // route's test, stop_is_operator_only_and_audited).
    let out = crewlet_cli(&["stop", "--node", &n.base, "--seat", "alpha"], None).await;
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "alpha: no turn was running"
    );

    // A refusal exits 1 with the node's reason.
    let out = crewlet_cli(&["pause", "--node", &n.base, "--seat", "ghost"], None).await;
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("\"ghost\"") && stderr.contains("not in the active company"),
        "{stderr}"
    );
    let mut viewer = tokio::process::Command::new(env!("CARGO_BIN_EXE_crewlet"));
    viewer
        .args([
            "resume", "--node", &n.base, "--seat", "alpha", "--token", TOKEN,
        ])
        .env_remove("CREWLET_TOKEN");
    let out = viewer.output().await.unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("only operators may resume a seat"));
    n.stop().await;
}

#[tokio::test]
async fn a_cross_site_pause_is_refused_even_for_a_signed_in_operator() {
    let n = TestNode::start().await;
    let op = client();
    sign_in(&n, &op, "olivia", "op-pass").await;
    let r = op
        .post(n.url("/api/seats/alpha/pause"))
        .header("origin", "http://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert_eq!(seat_pause(&n, "alpha").await, None);
    n.stop().await;
}

#[tokio::test]
async fn the_dashboards_seat_functions_pause_resume_and_stop_for_operators_only() {
    let n = TestNode::start().await;
    let op = client();
    sign_in(&n, &op, "olivia", "op-pass").await;
    let r = op
        .post(n.url("/api/pause_seat"))
        .form(&[("handle", "alpha"), ("reason", "from the Seats page")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        serde_json::json!({"seat": "alpha", "result": "paused"})
    );
    let record = seat_pause(&n, "alpha").await.expect("paused");
    assert_eq!(record.reason.as_deref(), Some("from the Seats page"));
    assert!(!record.stop_running_turn);
    let r = op
        .post(n.url("/api/resume_seat"))
        .form(&[("handle", "alpha")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.json::<Value>().await.unwrap()["result"], "resumed");
    let r = op
        .post(n.url("/api/pause_seat"))
        .form(&[("handle", "ghost")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);

    let viewer = client();
    sign_in(&n, &viewer, "victor", "view-pass").await;
    let r = viewer
        .post(n.url("/api/stop_seat_turn"))
        .form(&[("handle", "alpha")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let body = r.text().await.unwrap();
    assert!(
        body.contains("only operators may stop a seat's turn"),
        "{body}"
    );
    n.stop().await;
}

#[tokio::test]
async fn a_turn_that_panics_is_acked_and_health_shows_the_seats_last_error() {
    let n = TestNode::start().await;
    wait_for_seats(&n, serde_json::json!(["alpha"])).await;
    let r = client()
        .post(n.url("/api/seats/alpha/inbox"))
        .bearer_auth(DEPLOY_TOKEN)
        .body(r#"{"id":"boom-1","type":"task_assigned","body":{"echo":{"fail_round":1,"fail":"panic"}}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let health = support::wait_for(
        "health to show the seat's last error",
        Duration::from_secs(20),
        Duration::from_millis(20),
        || async {
            let h = health_seats_raw(&n).await;
            h.get("last_errors")
                .and_then(|e| e.get("alpha"))
                .is_some()
                .then_some(h)
        },
    )
    .await;
    assert!(
        health["last_errors"]["alpha"]
            .as_str()
            .unwrap()
            .contains("panics"),
        "{health}"
    );
    support::wait_for(
        "the panicked trigger to be acknowledged",
        Duration::from_secs(20),
        Duration::from_millis(20),
        || async { (inbox_pending(&n, "alpha").await == 0).then_some(()) },
    )
    .await;
    assert_eq!(effects_for(&n, "boom-1").await, 0);
    n.stop().await;
}

async fn health_seats_raw(n: &TestNode) -> Value {
    client()
        .get(n.url("/health"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// One frame of `GET /api/events`.
#[derive(Debug, Clone)]
struct SseFrame {
    event: String,
    id: u64,
    data: Value,
}

/// Reads `text/event-stream` frames off a response as they arrive.
struct SseReader {
    resp: reqwest::Response,
    buf: String,
    ended: bool,
}

impl SseReader {
    async fn open(n: &TestNode, c: &reqwest::Client, last_event_id: Option<&str>) -> SseReader {
        let mut req = c.get(n.url("/api/events"));
        if let Some(id) = last_event_id {
            req = req.header("Last-Event-ID", id);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(
            resp.headers()["content-type"].to_str().unwrap(),
            "text/event-stream"
        );
        SseReader {
            resp,
            buf: String::new(),
            ended: false,
        }
    }

    /// The next frame carrying an event (keep-alive comments skipped), or
    /// `None` once the stream has ended cleanly. Panics after `within`.
    async fn next(&mut self, within: Duration) -> Option<SseFrame> {
        let until = tokio::time::Instant::now() + within;
        loop {
            while let Some(end) = self.buf.find("\n\n") {
                let raw: String = self.buf.drain(..end + 2).collect();
                let (mut event, mut id, mut data) = (String::new(), None, String::new());
                for line in raw.lines() {
                    if let Some(v) = line.strip_prefix("event: ") {
                        event = v.to_string();
                    } else if let Some(v) = line.strip_prefix("id: ") {
                        id = Some(v.parse::<u64>().expect("ids are numbers"));
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        data.push_str(v);
                    }
                }
                if let Some(id) = id {
                    return Some(SseFrame {
                        event,
                        id,
                        data: serde_json::from_str(&data).expect("data is JSON"),
                    });
                }
            }
            if self.ended {
                return None;
            }
            let chunk = tokio::time::timeout_at(until, self.resp.chunk())
                .await
                .unwrap_or_else(|_| {
                    panic!("no event within {within:?}; read so far: {:?}", self.buf)
                })
                .expect("the stream ends cleanly");
            match chunk {
                Some(bytes) => self.buf.push_str(std::str::from_utf8(&bytes).unwrap()),
                None => self.ended = true,
            }
        }
    }

    /// Read on until an event named `name` about `seat`, returning every
    /// frame read on the way (it included).
    async fn until(&mut self, name: &str, seat: &str) -> Vec<SseFrame> {
        let mut seen = Vec::new();
        loop {
            let f = self
                .next(Duration::from_secs(20))
                .await
                .unwrap_or_else(|| panic!("the stream ended before {name}; saw {seen:?}"));
            let done = f.event == name && f.data["seat"] == seat;
            seen.push(f);
            if done {
                return seen;
            }
        }
    }
}

fn assert_increasing(frames: &[SseFrame]) {
    for w in frames.windows(2) {
        assert!(w[0].id < w[1].id, "ids must increase: {frames:?}");
    }
}

async fn api_pause(n: &TestNode, reason: &str) {
    let r = client()
        .post(n.url("/api/seats/alpha/pause"))
        .bearer_auth(DEPLOY_TOKEN)
        .body(serde_json::json!({ "reason": reason }).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
}

async fn api_resume(n: &TestNode) {
    let r = client()
        .post(n.url("/api/seats/alpha/resume"))
        .bearer_auth(DEPLOY_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
}

#[tokio::test]
async fn the_event_stream_requires_sign_in() {
    let n = TestNode::start().await;
    let r = client().get(n.url("/api/events")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = client()
        .get(n.url("/api/events"))
        .bearer_auth("not-a-token")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    // A viewer's session or token may read it.
    let viewer = client();
    sign_in(&n, &viewer, "victor", "view-pass").await;
    drop(SseReader::open(&n, &viewer, None).await);
    let r = client()
        .get(n.url("/api/events"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    drop(r);
    n.stop().await;
}

#[tokio::test]
async fn the_event_stream_sends_named_events_with_increasing_ids() {
    let n = TestNode::start().await;
    let op = client();
    sign_in(&n, &op, "olivia", "op-pass").await;
    let mut stream = SseReader::open(&n, &op, None).await;
    api_pause(&n, "keys").await;
    api_resume(&n).await;
    let mut frames = stream.until("seat_paused", "alpha").await;
    let paused = frames.last().unwrap().clone();
    assert_eq!(paused.data["event"], "seat_paused");
    assert_eq!(paused.data["node"], "node-http");
    assert!(
        paused.data["incarnation"]
            .as_str()
            .unwrap()
            .starts_with("node-http:")
    );
    assert!(!paused.data["at"].as_str().unwrap().is_empty());
    assert_eq!(paused.data["by"], "token:deploy");
    assert_eq!(paused.data["reason"], "keys");
    frames.extend(stream.until("seat_resumed", "alpha").await);
    let resumed = frames.last().unwrap();
    assert_eq!(resumed.data["by"], "token:deploy");
    assert!(paused.id < resumed.id);
    // Every frame's name is its data's event name.
    for f in &frames {
        assert_eq!(f.data["event"], f.event.as_str(), "{f:?}");
    }
    assert_increasing(&frames);
    n.stop().await;
}

#[tokio::test]
async fn a_new_stream_opened_with_last_event_id_in_its_query_gets_what_it_missed() {
    let n = TestNode::start().await;
    let op = client();
    sign_in(&n, &op, "olivia", "op-pass").await;
    let mut first = SseReader::open(&n, &op, None).await;
    api_pause(&n, "first").await;
    let last_seen = first.until("seat_paused", "alpha").await.last().unwrap().id;
    drop(first);
    api_resume(&n).await;
    let resp = op
        .get(n.url(&format!("/api/events?last_event_id={last_seen}")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut again = SseReader {
        resp,
        buf: String::new(),
        ended: false,
    };
    let missed = again.until("seat_resumed", "alpha").await;
    assert!(missed.iter().all(|f| f.id > last_seen), "{missed:?}");
    assert!(
        missed.iter().all(|f| f.event != "resync"),
        "replayed, not resynced: {missed:?}"
    );
    // An id the node never numbered: a resync, not silence.
    let resp = op
        .get(n.url("/api/events?last_event_id=not-a-number"))
        .send()
        .await
        .unwrap();
    let mut odd = SseReader {
        resp,
        buf: String::new(),
        ended: false,
    };
    let f = odd.next(Duration::from_secs(10)).await.unwrap();
    assert_eq!(f.event, "resync", "{f:?}");
    n.stop().await;
}

#[tokio::test]
async fn a_client_reconnecting_with_last_event_id_gets_what_it_missed() {
    let n = TestNode::start().await;
    let op = client();
    sign_in(&n, &op, "olivia", "op-pass").await;
    let mut first = SseReader::open(&n, &op, None).await;
    api_pause(&n, "first").await;
    let seen = first.until("seat_paused", "alpha").await;
    let last_seen = seen.last().unwrap().id;
    drop(first);

    // While nobody listens: resumed, paused again.
    api_resume(&n).await;
    api_pause(&n, "second").await;

    let mut again = SseReader::open(&n, &op, Some(&last_seen.to_string())).await;
    let mut missed = again.until("seat_resumed", "alpha").await;
    missed.extend(again.until("seat_paused", "alpha").await);
    assert!(
        missed.iter().all(|f| f.id > last_seen),
        "nothing already seen is sent again: {missed:?}"
    );
    assert!(missed.iter().all(|f| f.event != "resync"), "{missed:?}");
    assert_eq!(missed.last().unwrap().data["reason"], "second");
    assert_increasing(&missed);
    // Then it goes on live.
    api_resume(&n).await;
    let live = again.until("seat_resumed", "alpha").await;
    assert!(live[0].id > missed.last().unwrap().id);
    n.stop().await;
}

#[tokio::test]
async fn a_last_event_id_older_than_the_buffer_gets_a_resync_event() {
    let n = TestNode::start().await;
    let op = client();
    sign_in(&n, &op, "olivia", "op-pass").await;
    // Ids are numbered from the node's start time in microseconds, so 0 is
    // older than anything any node keeps; an id that is not a number, or
    // one newer than anything numbered (from a node that since restarted),
    // gets the same answer.
    for id in ["0", "not-an-id", "18446744073709551615"] {
        let mut stream = SseReader::open(&n, &op, Some(id)).await;
        let first = stream.next(Duration::from_secs(20)).await.unwrap();
        assert_eq!(first.event, "resync", "{id}: {first:?}");
        let reason = first.data["reason"].as_str().unwrap();
        assert!(reason.contains("read the current state again"), "{reason}");
        // Then live, after the resync's id.
        api_pause(&n, id).await;
        let live = stream.until("seat_paused", "alpha").await;
        assert!(live.iter().all(|f| f.id > first.id), "{live:?}");
        assert_eq!(live.last().unwrap().data["reason"], id);
        api_resume(&n).await;
    }
    n.stop().await;
}

#[tokio::test]
async fn shutdown_closes_open_event_streams() {
    let n = TestNode::start().await;
    wait_for_seats(&n, serde_json::json!(["alpha"])).await;
    let op = client();
    sign_in(&n, &op, "olivia", "op-pass").await;
    let mut by_session = SseReader::open(&n, &op, None).await;
    let by_token_client = reqwest::Client::new();
    let mut by_token = {
        let resp = by_token_client
            .get(n.url("/api/events"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        SseReader {
            resp,
            buf: String::new(),
            ended: false,
        }
    };
    // Neither client reads while the node shuts down.
    tokio::time::timeout(Duration::from_secs(60), n.stop())
        .await
        .expect("open event streams do not hold up a graceful shutdown");
    for stream in [&mut by_session, &mut by_token] {
        // Whatever was sent before the end is read, then the stream ends
        // cleanly (no reset, no truncated frame).
        while stream.next(Duration::from_secs(20)).await.is_some() {}
        assert!(stream.ended);
        assert!(stream.buf.trim().is_empty(), "{:?}", stream.buf);
    }
}

#[tokio::test]
async fn the_seat_list_shows_holder_state_pause_and_inbox_and_filters_on_the_node() {
    let n = TestNode::start().await;
    wait_for_seats(&n, serde_json::json!(["alpha"])).await;
    let op = client();
    sign_in(&n, &op, "olivia", "op-pass").await;
    let list = |form: Vec<(&'static str, &'static str)>| {
        let op = op.clone();
        let url = n.url("/api/list_seats");
        async move { op.post(url).form(&form).send().await.unwrap() }
    };
    let v: Value = list(vec![]).await.json().await.unwrap();
    assert_eq!(v["answered_by"], "node-http");
    assert_eq!(v["total"], 1);
    assert_eq!(
        (v["page"].as_u64(), v["pages"].as_u64()),
        (Some(1), Some(1))
    );
    let row = &v["rows"][0];
    assert_eq!(row["handle"], "alpha");
    assert_eq!(row["placement"], "any node");
    assert_eq!(row["state"], "attached");
    assert_eq!(row["holder"]["node_id"], "node-http");
    assert_eq!(row["holder"]["epoch"], 1);
    assert_eq!(row["pending"], 0);
    assert!(row["pause"].is_null());

    api_pause(&n, "keys").await;
    let v: Value = list(vec![("state", "paused")]).await.json().await.unwrap();
    let row = &v["rows"][0];
    assert_eq!(row["state"], "paused");
    assert_eq!(row["pause"]["by"], "token:deploy");
    assert_eq!(row["pause"]["reason"], "keys");
    let v: Value = list(vec![("state", "attached")])
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["matching"], 0);
    assert_eq!(v["rows"], serde_json::json!([]));
    let v: Value = list(vec![("query", "ALP")]).await.json().await.unwrap();
    assert_eq!(v["matching"], 1);
    let v: Value = list(vec![("query", "nothing-like-it")])
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["matching"], 0);

    let r = list(vec![("state", "sleepy")]).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(
        r.text()
            .await
            .unwrap()
            .contains("state: \\\"sleepy\\\" is not a seat state")
    );
    // A viewer reads it too; nobody signed out does.
    let viewer = client();
    sign_in(&n, &viewer, "victor", "view-pass").await;
    let r = viewer.post(n.url("/api/list_seats")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r = client()
        .post(n.url("/api/list_seats"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    n.stop().await;
}

/// GET `path` with the viewer token: (status, body).
async fn viewer_get(n: &TestNode, path: &str) -> (StatusCode, Value) {
    let r = client()
        .get(n.url(path))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    let status = r.status();
    (status, r.json().await.unwrap())
}

/// Publish one envelope to `handle`'s inbox with the operator token and
/// wait until its turn has run.
async fn run_a_turn(n: &TestNode, handle: &str, id: &str) {
    let r = client()
        .post(n.url(&format!("/api/seats/{handle}/inbox")))
        .bearer_auth(DEPLOY_TOKEN)
        .body(
            serde_json::json!({"id": id, "type": "task_assigned", "body": {"title": "remember this"}})
                .to_string(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    wait_for_turn(n, handle, id).await;
}

/// A role no node of these tests can run.
const GPU_ROLE: &str = "[[roles]]\nhandle = \"gpu-seat\"\nplacement = { labels = [\"gpu\"] }\n";

#[tokio::test]
async fn a_seats_memory_read_through_the_api_names_the_answering_node() {
    let n = TestNode::start().await;
    wait_for_seats(&n, serde_json::json!(["alpha"])).await;
    run_a_turn(&n, "alpha", "evt-mem-1").await;

    let (status, v) = viewer_get(&n, "/api/seats/alpha/memory").await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["state"], "held");
    assert_eq!(v["handle"], "alpha");
    assert_eq!(v["holder"]["node_id"], "node-http");
    assert_eq!(v["holder"]["epoch"], 1);
    assert_eq!(v["answered_by"]["node_id"], "node-http");
    assert_eq!(v["answered_by"]["epoch"], 1);
    assert_eq!(v["answered_by"]["local"], true);
    // The echo agent keeps one episode per unit of work and a diary note.
    let episodes = v["memory"]["episodes"].as_array().unwrap();
    assert_eq!(episodes.len(), 1, "{v}");
    assert!(!episodes[0]["summary"].as_str().unwrap().is_empty());
    assert!(!v["memory"]["diary"].as_array().unwrap().is_empty(), "{v}");
    for table in [
        "counterparty_profiles",
        "skills",
        "skill_versions",
        "onboarding_markers",
        "conversations",
    ] {
        assert!(v["memory"][table].is_array(), "{table}: {v}");
    }

    // The page's server function answers the same, and says who answered.
    let viewer = client();
    sign_in(&n, &viewer, "victor", "view-pass").await;
    let r = viewer
        .post(n.url("/api/seat_memory"))
        .form(&[("handle", "alpha")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let read: app::api::SeatMemoryRead = r.json().await.unwrap();
    assert_eq!(
        read.who_answered(),
        "answered by node-http (holder, epoch 1)"
    );
    n.stop().await;
}

#[tokio::test]
async fn the_memory_overview_lists_every_seat_with_counts_and_its_coverage() {
    let n = TestNode::start_with(GPU_ROLE).await;
    wait_for_seats(&n, serde_json::json!(["alpha"])).await;
    run_a_turn(&n, "alpha", "evt-mem-2").await;

    let (status, v) = viewer_get(&n, "/api/memory").await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["node_id"], "node-http");
    let seats = v["seats"].as_array().unwrap();
    let handles: Vec<&str> = seats
        .iter()
        .map(|s| s["handle"].as_str().unwrap())
        .collect();
    assert_eq!(handles, ["alpha", "gpu-seat"]);
    let alpha = &seats[0];
    assert_eq!(alpha["state"], "held");
    assert_eq!(alpha["answered_by"]["node_id"], "node-http");
    assert_eq!(alpha["memory"]["episodes"], 1);
    assert!(alpha["memory"]["diary"].as_u64().unwrap() >= 1, "{alpha}");
    // Nobody may run gpu-seat: it is listed, holding nothing, naming no
    // holder.
    let gpu = &seats[1];
    assert_eq!(gpu["state"], "unheld");
    assert!(gpu.get("holder").is_none(), "{gpu}");
    assert_eq!(gpu["memory"]["episodes"], 0);
    // This node answered for its own seats; nobody failed to answer.
    let answered = v["coverage"]["answered"].as_array().unwrap();
    assert_eq!(answered.len(), 1, "{v}");
    assert_eq!(answered[0]["node_id"], "node-http");
    assert_eq!(answered[0]["local"], true);
    assert_eq!(answered[0]["seats"], serde_json::json!(["alpha"]));
    assert_eq!(v["coverage"]["unanswered"], serde_json::json!([]));

    // The page's server function pages and searches the same overview.
    let op = client();
    sign_in(&n, &op, "olivia", "op-pass").await;
    let r = op
        .post(n.url("/api/memory_overview"))
        .form(&[("query", "GPU")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let page: app::api::MemoryOverviewPage = r.json().await.unwrap();
    assert_eq!((page.total, page.held, page.unheld), (2, 1, 1));
    assert_eq!(page.matching, 1);
    assert_eq!(page.seats[0].handle(), "gpu-seat");
    assert_eq!(page.rows.episodes, 1, "totals are of every seat");
    n.stop().await;
}

#[tokio::test]
async fn the_memory_of_a_seat_not_in_the_company_is_404_and_needs_sign_in() {
    let n = TestNode::start().await;
    let (status, v) = viewer_get(&n, "/api/seats/nobody/memory").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let msg = v["error"].as_str().unwrap();
    assert!(
        msg.contains("\"nobody\" is not in the active company"),
        "{msg}"
    );
    let viewer = client();
    sign_in(&n, &viewer, "victor", "view-pass").await;
    let r = viewer
        .post(n.url("/api/seat_memory"))
        .form(&[("handle", "nobody")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    for path in ["/api/seats/alpha/memory", "/api/memory"] {
        let r = client().get(n.url(path)).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{path}");
        let r = viewer.get(n.url(path)).send().await.unwrap();
        assert_eq!(
            r.status(),
            StatusCode::OK,
            "{path}: a viewer's session reads it"
        );
    }
    n.stop().await;
}

#[tokio::test]
async fn a_seats_tools_are_listed_with_their_annotations_to_a_viewer_and_to_nobody_unsigned() {
    let n = TestNode::start().await;
    wait_for_seats(&n, serde_json::json!(["alpha"])).await;
    let (status, v) = viewer_get(&n, "/api/seats/alpha/tools").await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["seat"], "alpha");
    assert_eq!(v["held_here"], true);
    let tools = v["tools"].as_array().unwrap();
    let post = tools
        .iter()
        .find(|t| t["name"] == "post_outbox")
        .expect("the built-ins are listed");
    assert_eq!(post["annotations"]["open_world"], true);
    assert_eq!(post["annotations"]["read_only"], false);
    let (status, _) = viewer_get(&n, "/api/seats/nobody/tools").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let r = client()
        .get(n.url("/api/seats/alpha/tools"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    n.stop().await;
}

/// `/query/fleet` once `want` holds of it.
async fn fleet_when(n: &TestNode, what: &str, want: impl Fn(&Value) -> bool) -> Value {
    support::wait_for(
        what,
        Duration::from_secs(20),
        Duration::from_millis(50),
        || async {
            let (_, v) = viewer_get(n, "/query/fleet").await;
            want(&v).then_some(v)
        },
    )
    .await
}

fn alarms_of(v: &Value, kind: &str) -> Vec<Value> {
    v["alarms"]
        .as_array()
        .map(|a| a.iter().filter(|x| x["kind"] == kind).cloned().collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn the_fleet_shows_unplaceable_seats_and_a_protocol_floor_as_alarms() {
    use crewlet::coord::{Claim, ClaimRequest};
    let n = TestNode::start_with(GPU_ROLE).await;
    let v = fleet_when(&n, "gpu-seat to be reported unplaceable", |v| {
        !alarms_of(v, "unplaceable").is_empty()
    })
    .await;
    assert_eq!(
        alarms_of(&v, "unplaceable"),
        vec![serde_json::json!({"kind": "unplaceable", "seats": ["gpu-seat"]})]
    );
    assert!(alarms_of(&v, "protocol_floor").is_empty(), "{v}");
    assert!(v.get("stale").is_none(), "{v}");
    assert!(v["read_at"].as_str().unwrap().ends_with('Z'), "{v}");

    // A node of an older protocol joins: nodes of protocol 4 may claim
    // nothing while it is here.
    let store = n.node.as_ref().unwrap().engine.store().clone();
    let Claim::Won(old) = store
        .claim(ClaimRequest::new("node:old-node", "old-node:0001", "old-node").with_protocol(3))
        .await
        .unwrap()
    else {
        panic!("the presence row is free");
    };
    let (_, v) = viewer_get(&n, "/query/fleet").await;
    assert_eq!(
        alarms_of(&v, "protocol_floor"),
        vec![serde_json::json!({
            "kind": "protocol_floor",
            "floor": 3,
            "protocol": 4,
            "nodes": ["old-node"],
            "claims_blocked_here": false,
        })]
    );
    let old_row = v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node_id"] == "old-node")
        .cloned()
        .unwrap();
    assert_eq!(old_row["protocol"], 3);
    // Alarms are listed most serious first: the floor before the seats.
    let kinds: Vec<&str> = v["alarms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["protocol_floor", "unplaceable"]);

    // It leaves: the floor is gone.
    store.release(&old, "old-node:0001").await.unwrap();
    let (_, v) = viewer_get(&n, "/query/fleet").await;
    assert!(alarms_of(&v, "protocol_floor").is_empty(), "{v}");
    n.stop().await;
}

#[tokio::test]
async fn an_undead_seat_is_an_alarm_saying_for_how_long_until_its_teardown_is_proven() {
    // Teardowns are retried at each heartbeat: a short one ends the test
    // soon after the teardown can succeed.
    let role = "[[roles]]\nhandle = \"stubborn\"\n\n[coordination]\nheartbeat_seconds = 3\n";
    let n = TestNode::start_with(role).await;
    wait_for_seats(&n, serde_json::json!(["alpha", "stubborn"])).await;
    // Its teardown cannot be proven (what a child stuck in the kernel past
    // SIGKILL leaves): a fault holds it.
    n.running()
        .turns
        .faults
        .held_teardown
        .lock()
        .unwrap()
        .insert("stubborn".into());
    // The role leaves the company: the seat is released, and its teardown
    // fails.
    let r = client()
        .post(n.url("/api/company"))
        .bearer_auth(DEPLOY_TOKEN)
        .body("[[roles]]\nhandle = \"alpha\"\n")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let v = fleet_when(&n, "the undead seat to be an alarm", |v| {
        !alarms_of(v, "unproven").is_empty()
    })
    .await;
    let alarm = &alarms_of(&v, "unproven")[0];
    assert_eq!(alarm["seat"], "stubborn");
    assert_eq!(alarm["node"], "node-http");
    assert_eq!(alarm["epoch"], 1);
    assert!(alarm["seconds"].is_u64(), "{alarm}");
    assert!(alarm["since"].as_str().unwrap().ends_with('Z'), "{alarm}");
    // The node still shows the seat under it: it keeps the lease.
    assert!(
        v["nodes"][0]["seats"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["handle"] == "stubborn"),
        "{v}"
    );
    // /health names the seat and how long its teardown has failed, and
    // /metrics counts it, while it does.
    let health = health_seats_raw(&n).await;
    assert!(health["unproven_seconds"]["stubborn"].is_u64(), "{health}");
    let metrics = client()
        .get(n.url("/metrics"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("crewlet_seats_unproven{") && l.ends_with("} 1")),
        "{metrics}"
    );

    // The teardown can succeed again: proven at the next retry, the alarm
    // goes.
    n.running()
        .turns
        .faults
        .held_teardown
        .lock()
        .unwrap()
        .clear();
    fleet_when(&n, "the alarm to clear", |v| {
        alarms_of(v, "unproven").is_empty()
    })
    .await;
    support::wait_for(
        "/health to drop unproven_seconds",
        Duration::from_secs(20),
        Duration::from_millis(50),
        || async {
            health_seats_raw(&n)
                .await
                .get("unproven_seconds")
                .is_none()
                .then_some(())
        },
    )
    .await;
    n.stop().await;
}

#[tokio::test]
async fn while_the_roster_cannot_be_read_the_last_one_read_is_shown_as_unknown_with_its_time() {
    use crewlet::coord::StoreError;
    use crewlet::web::nodes::{LastRoster, LocalFacts, Roster, fleet_view, rfc3339};
    let n = TestNode::start().await;
    wait_for_seats(&n, serde_json::json!(["alpha"])).await;
    let store = n.node.as_ref().unwrap().engine.store().clone();
    let facts = LocalFacts {
        node_id: "node-http".into(),
        protocol: 4,
        now: 1_796_025_076,
        ..Default::default()
    };
    let down = || Err(StoreError::Unavailable("no quorum".into()));
    let memory = LastRoster::default();

    // Nothing was ever read: nothing to show.
    assert!(memory.answer(down()).is_err());

    // A good read is shown as it is, and kept.
    let read = Roster::read(&*store, 1_796_025_000).await;
    let fresh = memory.answer(read).unwrap();
    assert!(fresh.stale.is_none());
    let view = fleet_view("node-http", "c", "local", &fresh, &facts);
    assert_eq!(view.nodes[0].status, app::api::NodeStatus::Serving);
    assert_eq!(view.nodes[0].last_status, None);
    assert_eq!(view.read_at, "2026-11-30T07:50:00Z");

    // The store fails: the last roster, every status unknown, the status
    // it had kept beside, marked with why and when it was read.
    let stale = memory.answer(down()).unwrap();
    let why = stale.stale.clone().unwrap();
    assert!(
        why.contains("cannot be read") && why.contains("no quorum"),
        "{why}"
    );
    let view = fleet_view("node-http", "c", "local", &stale, &facts);
    assert_eq!(view.read_at, rfc3339(1_796_025_000));
    assert_eq!(view.stale.as_deref(), Some(why.as_str()));
    assert_eq!(view.nodes.len(), 1);
    assert_eq!(view.nodes[0].status, app::api::NodeStatus::Unknown);
    assert_eq!(
        view.nodes[0].last_status,
        Some(app::api::NodeStatus::Serving)
    );
    assert_eq!(view.nodes[0].seats[0].handle, "alpha");
    let json = serde_json::to_value(&view).unwrap();
    assert_eq!(json["nodes"][0]["status"], "unknown");
    assert_eq!(json["nodes"][0]["last_status"], "serving");

    // The store answers again: fresh, nothing stale.
    let again = memory
        .answer(Roster::read(&*store, 1_796_025_100).await)
        .unwrap();
    assert!(again.stale.is_none());
    let view = fleet_view("node-http", "c", "local", &again, &facts);
    assert_eq!(view.nodes[0].status, app::api::NodeStatus::Serving);

    // What the node answers now is fresh too: no stale mark, no alarm.
    let (status, v) = viewer_get(&n, "/query/fleet").await;
    assert_eq!(status, StatusCode::OK);
    assert!(v.get("stale").is_none(), "{v}");
    assert_eq!(v["alarms"], serde_json::json!([]));
    assert!(v["nodes"][0].get("last_status").is_none(), "{v}");
    n.stop().await;
}

/// `/health`'s count of the detached runs whose command runs here.
async fn health_detached_runs(n: &TestNode) -> u64 {
    health_seats_raw(n).await["detached_runs"].as_u64().unwrap()
}

async fn wait_for_detached_runs(n: &TestNode, want: u64) {
    support::wait_for(
        &format!("/health to count {want} detached run(s)"),
        Duration::from_secs(20),
        Duration::from_millis(20),
        || async { (health_detached_runs(n).await == want).then_some(()) },
    )
    .await;
}

/// Start a detached run on alpha through a turn of its echo agent; its id.
async fn start_detached_run(n: &TestNode, id: &str, argv: &[&str]) -> String {
    let body =
        serde_json::json!({"id": id, "type": "task_assigned", "body": {"run": {"argv": argv}}});
    let r = client()
        .post(n.url("/api/seats/alpha/inbox"))
        .bearer_auth(DEPLOY_TOKEN)
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let turns = n.node.as_ref().unwrap().turns.clone();
    support::wait_for(
        &format!("the run {id} asked for to be recorded"),
        Duration::from_secs(20),
        Duration::from_millis(20),
        || async {
            turns
                .runs()
                .list("alpha")
                .await
                .unwrap()
                .into_iter()
                .find(|(r, _)| r.state == crewlet::engine::runs::RunState::Running)
                .map(|(r, _)| r.run_id)
        },
    )
    .await
}

#[tokio::test]
async fn health_counts_the_detached_runs_running_on_the_node_and_none_once_they_finished_or_ended()
{
    use crewlet::engine::runs::RunState;
    let n = TestNode::start().await;
    wait_for_seats(&n, serde_json::json!(["alpha"])).await;
    assert_eq!(health_detached_runs(&n).await, 0);
    let turns = n.node.as_ref().unwrap().turns.clone();
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("go");
    // A run that waits for a file, so the test decides when it finishes.
    let script = format!(
        "while [ ! -e {} ]; do sleep 0.05; done; echo finished",
        gate.display()
    );
    let run = start_detached_run(&n, "run-1", &["/bin/sh", "-c", &script]).await;
    wait_for_detached_runs(&n, 1).await;
    std::fs::write(&gate, b"").unwrap();
    wait_for_detached_runs(&n, 0).await;
    support::wait_for(
        "the finished run to be resumed",
        Duration::from_secs(20),
        Duration::from_millis(20),
        || async {
            let (r, _) = turns.runs().get("alpha", &run).await.unwrap().unwrap();
            (r.state == RunState::Finished && r.resumed).then_some(())
        },
    )
    .await;
    // A run ended on purpose (its record marked ended): its child is
    // killed and the count goes back to 0.
    let run = start_detached_run(&n, "run-2", &["/bin/sleep", "60"]).await;
    wait_for_detached_runs(&n, 1).await;
    let epoch = n
        .node
        .as_ref()
        .unwrap()
        .engine
        .store()
        .lease("seat:alpha")
        .await
        .unwrap()
        .unwrap()
        .epoch;
    turns
        .runs()
        .mutate("alpha", &run, epoch, |r| {
            r.state = RunState::Ended;
            true
        })
        .await
        .unwrap();
    wait_for_detached_runs(&n, 0).await;
    n.stop().await;
}

/// The Audit page's read: filters by person, action, seat and refusals
/// (each exact), and pages of 200 past the first, saying when older
/// actions are kept.
#[tokio::test]
async fn the_audit_log_filters_by_person_action_seat_and_refusals_and_pages_past_200() {
    let n = TestNode::start().await;
    let post = |path: String, token: &'static str| {
        let url = n.url(&path);
        async move {
            client()
                .post(url)
                .bearer_auth(token)
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    assert_eq!(
        post("/api/seats/alpha/pause".into(), OPS_TOKEN).await,
        StatusCode::OK
    );
    assert_eq!(
        post("/api/seats/alpha/resume".into(), OPS_TOKEN).await,
        StatusCode::OK
    );
    // 205 refusals: a viewer's token may not pause.
    for _ in 0..205 {
        assert_eq!(
            post("/api/seats/alpha/pause".into(), TOKEN).await,
            StatusCode::FORBIDDEN
        );
    }
    let op = n.signed_in(support::http_node::OPERATOR).await;
    let read = |form: Vec<(&'static str, &'static str)>| {
        let op = op.clone();
        let url = n.url("/api/audit_log");
        async move {
            let r = op.post(url).form(&form).send().await.unwrap();
            assert_eq!(r.status(), StatusCode::OK);
            r.json::<Value>().await.unwrap()
        }
    };
    let first = read(vec![]).await;
    assert_eq!(first["entries"].as_array().unwrap().len(), 200);
    assert_eq!(first["page"], 1);
    assert_eq!(first["more"], true);
    let second = read(vec![("page", "2")]).await;
    let rest = second["entries"].as_array().unwrap();
    // 207 actions and the operator's sign-in.
    assert_eq!(rest.len(), 8, "{rest:?}");
    assert_eq!(second["more"], false);
    // Newest first across the pages: the sign-in on top, the first pause last.
    assert_eq!(first["entries"][0]["action"], "session.sign_in");
    let oldest = rest.last().unwrap();
    assert_eq!(
        (&oldest["person"], &oldest["action"], &oldest["result"]),
        (
            &Value::from("token:ops"),
            &Value::from("seat.pause"),
            &Value::from("paused")
        )
    );

    let refused = read(vec![("refused", "true"), ("page", "2")]).await;
    let refused = refused["entries"].as_array().unwrap().clone();
    assert_eq!(refused.len(), 5);
    assert!(
        refused
            .iter()
            .all(|e| e["result"].as_str().unwrap().starts_with("refused"))
    );
    let ops = read(vec![("person", "token:ops")]).await;
    let ops = ops["entries"].as_array().unwrap().clone();
    assert_eq!(ops.len(), 2, "{ops:?}");
    let resumes = read(vec![("action", "seat.resume"), ("seat", "alpha")]).await;
    let resumes = resumes["entries"].as_array().unwrap().clone();
    assert_eq!(resumes.len(), 1);
    assert_eq!(resumes[0]["person"], "token:ops");
    let none = read(vec![("seat", "nobody")]).await;
    assert_eq!(none["entries"], serde_json::json!([]));
    n.stop().await;
}
