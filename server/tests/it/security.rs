//! The node's security promises, black box where it can be: mail is data
//! and never code (over HTTP and straight onto NATS), deploying is an
//! admin's alone, a sign-in cannot be raced or used to exhaust memory,
//! `next` is only a path, every answer carries the security headers,
//! every input is bounded, sessions end when they should and a role
//! change holds on the next request.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use support::http_node::{
    ADMIN, DEPLOY_TOKEN, HttpNode, MONITORING_TOKEN, OPERATOR, OPS_TOKEN, Rig, VIEWER, client,
    location,
};

const WAIT: Duration = Duration::from_secs(20);

async fn health_seats(n: &HttpNode) -> Value {
    let v: Value = client()
        .get(n.url("/health"))
        .bearer_auth(MONITORING_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["seats"].clone()
}

async fn wait_for_alpha(n: &HttpNode) {
    support::wait_for("alpha held", WAIT, Duration::from_millis(20), || async {
        (health_seats(n).await == json!(["alpha"])).then_some(())
    })
    .await;
}

/// The echo effects this node's outbox holds for trigger `id`.
async fn effects_for(n: &HttpNode, id: &str) -> Vec<Value> {
    n.running()
        .turns
        .outbox()
        .read(None)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.trigger_ids.iter().any(|t| t == id))
        .map(|e| e.body)
        .collect()
}

async fn wait_for_effect(n: &HttpNode, id: &str) -> Value {
    support::wait_for(
        &format!("the effect of {id}"),
        WAIT,
        Duration::from_millis(20),
        || async { effects_for(n, id).await.into_iter().next() },
    )
    .await
}

async fn send(n: &HttpNode, token: &str, envelope: &Value) -> reqwest::Response {
    client()
        .post(n.url("/api/seats/alpha/inbox"))
        .bearer_auth(token)
        .body(envelope.to_string())
        .send()
        .await
        .unwrap()
}

async fn audit_rows(n: &HttpNode) -> Vec<Value> {
    let admin = n.signed_in(ADMIN).await;
    let r = admin.post(n.url("/api/audit_log")).send().await.unwrap();
    support::audit_entries(r.json().await.unwrap())
}

/// A node of `text` (a company file on NATS) in this process, once it
/// holds `alpha`.
async fn nats_node(text: &str) -> crewlet::node::RunningNode {
    let config = crewlet::config::Config::parse("nats.toml", text, &BTreeMap::new()).unwrap();
    let node = crewlet::node::start(config).await.unwrap();
    support::wait_for("alpha held", WAIT, Duration::from_millis(50), || async {
        node.engine
            .host()
            .held()
            .contains(&"alpha".to_string())
            .then_some(())
    })
    .await;
    node
}

/// Wait until `node`'s outbox has an effect naming trigger `id`.
async fn answered_on(node: &crewlet::node::RunningNode, id: &str) {
    support::wait_for(
        &format!("the turn of {id}"),
        WAIT,
        Duration::from_millis(50),
        || async {
            node.turns
                .outbox()
                .read(None)
                .await
                .ok()?
                .iter()
                .any(|e| e.trigger_ids.iter().any(|t| t == id))
                .then_some(())
        },
    )
    .await;
}

/// `count` wrong guesses of `admin`'s password posted to `url` at once,
/// each from its own client; the status of each answer.
async fn wrong_guesses(url: &str, count: usize) -> Vec<StatusCode> {
    let guesses = (0..count).map(|i| async move {
        client()
            .post(url)
            .form(&[
                ("name", "admin".to_string()),
                ("password", format!("guess-{i}")),
            ])
            .send()
            .await
            .unwrap()
            .status()
    });
    futures::future::join_all(guesses).await
}

// ---- 1. Mail is data ----

#[tokio::test]
async fn inbox_mail_carrying_run_argv_never_starts_a_program_on_a_node_as_shipped() {
    let n = HttpNode::start_as(Rig::Production, "").await;
    wait_for_alpha(&n).await;
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("pwned");
    let r = send(
        &n,
        OPS_TOKEN,
        &json!({"id": "evil-1", "type": "task_assigned", "body": {
            "run": {"argv": ["/bin/touch", marker.display().to_string()]},
            "echo": {"fail_round": 1, "fail": "panic"},
            "forward_to": "alpha",
        }}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    // The turn ran to its end: the effect is posted in the round a run
    // would have been started in, so by now it would have run.
    let effect = wait_for_effect(&n, "evil-1").await;
    assert_eq!(effect["triggers"][0]["id"], "evil-1", "{effect}");
    assert!(!marker.exists(), "mail started a program");
    assert_eq!(n.running().turns.supervisor().running(), 0);
    let runs = n.running().turns.runs().list("alpha").await.unwrap();
    assert!(runs.is_empty(), "no run record: {runs:?}");
    n.stop().await;
}

#[tokio::test]
async fn mail_published_straight_onto_nats_with_no_credentials_never_starts_a_program() {
    let nats = support::nats::NatsServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("pwned");
    let text = format!(
        r#"
[node]
id = "node-nats"
listen = "127.0.0.1:0"
data_dir = "{data}"

[coordination]
type = "embedded-kv"

[stream]
type = "nats"
urls = ["{url}"]

[[roles]]
handle = "alpha"
"#,
        data = dir.path().join("data").display(),
        url = nats.url(),
    );
    let node = nats_node(&text).await;
    // Anyone who can publish to the subject: no HTTP, no token.
    let raw = async_nats::connect(nats.url()).await.unwrap();
    let js = async_nats::jetstream::new(raw);
    let mail = json!({"id": "nats-evil-1", "type": "task_assigned", "body": {
        "run": {"argv": ["/bin/touch", marker.display().to_string()]}
    }});
    js.publish("crewlet.agent.alpha.inbox", mail.to_string().into())
        .await
        .unwrap()
        .await
        .unwrap();
    answered_on(&node, "nats-evil-1").await;
    assert!(!marker.exists(), "mail on NATS started a program");
    assert_eq!(node.turns.supervisor().running(), 0);
    node.shutdown().await.unwrap();
}

/// The NATS users docs/security.md § Security model recommends, with the
/// passwords spelled out.
const NATS_USERS: &str = r#"authorization {
  users = [
    { user: crewlet-node, password: node-pw,
      permissions: { publish: ">", subscribe: ">" } }
    { user: mailer, password: mailer-pw,
      permissions: { publish: { allow: ["crewlet.agent.*.inbox"] },
                     subscribe: { allow: ["_INBOX.>"] } } }
  ]
}
"#;

#[tokio::test]
async fn a_mail_only_nats_user_delivers_mail_and_cannot_write_the_fleets_buckets() {
    let nats =
        support::nats::NatsServer::start_with(NATS_USERS, Some(("crewlet-node", "node-pw"))).await;
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "[node]\nid = \"node-nats\"\nlisten = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n\n[coordination]\ntype = \"embedded-kv\"\n\n[stream]\ntype = \"nats\"\nurls = [\"{}\"]\nuser = \"crewlet-node\"\npassword = \"node-pw\"\n\n[[roles]]\nhandle = \"alpha\"\n",
        dir.path().join("data").display(),
        nats.url(),
    );
    let node = nats_node(&text).await;
    let mailer =
        async_nats::ConnectOptions::with_user_and_password("mailer".into(), "mailer-pw".into())
            .request_timeout(Some(Duration::from_secs(2)))
            .connect(nats.url())
            .await
            .unwrap();
    let js = async_nats::jetstream::new(mailer);
    let mail =
        json!({"id": "mailer-1", "type": "task_assigned", "body": {"title": "from the mailer"}});
    js.publish("crewlet.agent.alpha.inbox", mail.to_string().into())
        .await
        .unwrap()
        .await
        .expect("the stream acknowledges the mailer's mail");
    answered_on(&node, "mailer-1").await;
    // The active company is out of its reach (the server drops the publish:
    // no acknowledgement comes).
    let forged = js
        .publish("$KV.crewlet_config.active", "{\"revision\": 99}".into())
        .await;
    let acked = match forged {
        Ok(ack) => ack.await.is_ok(),
        Err(_) => false,
    };
    assert!(!acked, "the mailer wrote the fleet's active company");
    assert_eq!(node.engine.company().revision, 1);
    node.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_company_with_drills_is_refused_by_a_node_that_is_not_a_test_node() {
    let n = HttpNode::start_as(Rig::Production, "").await;
    let r = client()
        .post(n.url("/api/company"))
        .bearer_auth(DEPLOY_TOKEN)
        .body("[node]\nenvironment = \"test\"\n[[roles]]\nhandle = \"alpha\"\nagent = { kind = \"echo\", drills = true }\n")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let v: Value = r.json().await.unwrap();
    let msg = v["error"].as_str().unwrap();
    assert!(msg.contains("roles[0].agent.drills"), "{msg}");
    n.stop().await;
}

// ---- 2. Deploying is not operating ----

#[tokio::test]
async fn only_an_admin_applies_a_company_an_operator_is_refused_and_audited() {
    let n = HttpNode::start_as(Rig::Production, "").await;
    let file = "[[roles]]\nhandle = \"alpha\"\n[[roles]]\nhandle = \"beta\"\n";
    let r = client()
        .post(n.url("/api/company"))
        .bearer_auth(OPS_TOKEN)
        .body(file)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("only admins may apply"),
        "{v}"
    );
    // The operator's session is refused the same way.
    let op = n.signed_in(OPERATOR).await;
    let r = op
        .post(n.url("/api/company"))
        .body(file)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let rows = audit_rows(&n).await;
    assert!(
        rows.iter().any(|e| e["person"] == "token:ops"
            && e["action"] == "company.apply"
            && e["result"] == "refused: not an admin"),
        "{rows:?}"
    );
    let r = client()
        .post(n.url("/api/company"))
        .bearer_auth(DEPLOY_TOKEN)
        .body(file)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK, "an admin applies it");
    n.stop().await;
}

#[tokio::test]
async fn a_node_that_does_not_allow_command_agents_refuses_a_company_with_them_naming_the_roles() {
    let n = HttpNode::start_full(Rig::Production, "allow_command_agents = false", "").await;
    wait_for_alpha(&n).await;
    let r = client()
        .post(n.url("/api/company"))
        .bearer_auth(DEPLOY_TOKEN)
        .body("[[roles]]\nhandle = \"alpha\"\n[[roles]]\nhandle = \"shell\"\nagent = { kind = \"command\", argv = [\"/bin/sh\", \"-c\", \"id\"] }\n")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let v: Value = r.json().await.unwrap();
    let msg = v["error"].as_str().unwrap();
    assert!(
        msg.contains("allow_command_agents")
            && msg.contains("shell")
            && msg.contains("nothing was applied"),
        "{msg}"
    );
    // Nothing was applied: still revision 1, its one seat held.
    assert_eq!(n.running().engine.company().revision, 1);
    assert_eq!(health_seats(&n).await, json!(["alpha"]));
    n.stop().await;
}

// ---- 3. Redirects ----

#[tokio::test]
async fn after_sign_in_next_is_only_a_path_on_this_site() {
    let n = HttpNode::start().await;
    for (next, want) in [
        ("/seats?q=a", "/seats?q=a"),
        ("/\t/127.0.0.1:3999/phish", "/settings/nodes"),
        ("//evil.example/x", "/settings/nodes"),
        ("/\\evil.example", "/settings/nodes"),
        ("/\r\nSet-Cookie: a=b", "/settings/nodes"),
        ("https://evil.example/", "/settings/nodes"),
    ] {
        let c = client();
        let r = c
            .post(n.url("/login"))
            .form(&[("name", VIEWER.0), ("password", VIEWER.1), ("next", next)])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::SEE_OTHER, "next {next:?}");
        assert_eq!(location(&r), want, "next {next:?}");
    }
    n.stop().await;
}

// ---- 4. Sign-in that cannot be raced ----

#[tokio::test]
async fn concurrent_wrong_guesses_are_counted_before_checking_and_a_refusal_is_audited() {
    let n = HttpNode::start().await;
    let answers = wrong_guesses(&n.url("/login"), 100).await;
    let checked = answers
        .iter()
        .filter(|s| **s == StatusCode::SEE_OTHER)
        .count();
    let refused = answers
        .iter()
        .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert_eq!(checked + refused, 100, "{answers:?}");
    assert!(
        checked <= crewlet::web::auth::MAX_CONCURRENT_CHECKS,
        "{checked} of 100 concurrent guesses had their password checked"
    );
    let rows = audit_rows(&n).await;
    assert!(
        rows.iter().any(|e| e["person"] == "admin"
            && e["action"] == "session.sign_in"
            && e["reason"] == "from 127.0.0.1"
            && e["result"] == "refused: wrong name or password"),
        "{rows:?}"
    );
    let unchecked: Vec<&Value> = rows
        .iter()
        .filter(|e| {
            e["person"] == "admin"
                && e["result"] != "refused: wrong name or password"
                && e["result"].as_str().unwrap_or("").starts_with("refused:")
        })
        .collect();
    assert!(
        !unchecked.is_empty(),
        "a refusal without a password check is audited: {rows:?}"
    );
    assert!(
        unchecked.len() <= 10,
        "a burst writes a bounded number of audit rows, not one per guess: {}",
        unchecked.len()
    );
    n.stop().await;
}

#[tokio::test]
async fn a_stranger_guessing_from_one_address_does_not_lock_the_name_out_elsewhere() {
    let n =
        HttpNode::start_full(Rig::Test, "", "[auth]\ntrusted_proxies = [\"127.0.0.1\"]\n").await;
    let from = |c: &reqwest::Client, ip: &str, password: &str| {
        c.post(n.url("/login"))
            .header("x-forwarded-for", ip)
            .form(&[("name", VIEWER.0), ("password", password), ("next", "/")])
            .send()
    };
    let c = client();
    let mut limited = false;
    for _ in 0..10 {
        let r = from(&c, "198.51.100.66", "wrong").await.unwrap();
        limited |= r.status() == StatusCode::TOO_MANY_REQUESTS;
    }
    assert!(limited, "the guessing address is slowed down");
    // The person, from their own address behind the same proxy, signs in
    // (the name's own delay from anywhere is a few seconds at most, and
    // ten failures are within its free attempts).
    let r = from(&client(), "198.51.100.7", VIEWER.1).await.unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(location(&r), "/");
    let rows = audit_rows(&n).await;
    assert!(
        rows.iter().any(|e| e["reason"] == "from 198.51.100.66"),
        "the forwarded address is the one audited: {rows:?}"
    );
    n.stop().await;
}

// ---- 5. Bounded input ----

/// Post `file` to `/api/company` as the admin token while asking
/// `/health`, which must answer 200; the apply's answer.
async fn apply_while_health_answers(n: &HttpNode, file: String) -> reqwest::Response {
    let post = client()
        .post(n.url("/api/company"))
        .bearer_auth(DEPLOY_TOKEN)
        .body(file)
        .send();
    let health = async {
        client()
            .get(n.url("/health"))
            .send()
            .await
            .unwrap()
            .status()
    };
    let (r, h) = tokio::join!(post, health);
    assert_eq!(h, StatusCode::OK, "/health answers while a company is read");
    r.unwrap()
}

#[tokio::test]
async fn a_company_file_over_8_mib_is_refused_at_once_with_a_sentence_while_health_answers() {
    let n = HttpNode::start().await;
    let mut huge = String::from("[[roles]]\nhandle = \"alpha\"\n[node]\n");
    while huge.len() < 9 * 1024 * 1024 {
        huge.push_str(&format!("unknown_{} = 1\n", huge.len()));
    }
    let r = apply_while_health_answers(&n, huge.clone()).await;
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let v: Value = r.json().await.unwrap();
    assert!(v["error"].as_str().unwrap().contains("8 MiB"), "{v}");

    // An operator's file is not read at all: refused for the role, not
    // the size, and audited.
    let r = client()
        .post(n.url("/api/company"))
        .bearer_auth(OPS_TOKEN)
        .body(huge)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert!(
        audit_rows(&n)
            .await
            .iter()
            .any(|e| e["person"] == "token:ops"
                && e["action"] == "company.apply"
                && e["result"] == "refused: not an admin"),
        "the operator's attempt is audited"
    );

    // Just under the limit, all unknown keys: refused with a short answer
    // listing a bounded number of problems.
    let mut many = String::from("[node]\n");
    while many.len() < 250 * 1024 {
        many.push_str(&format!("k{} = 1\n", many.len()));
    }
    let r = client()
        .post(n.url("/api/company"))
        .bearer_auth(DEPLOY_TOKEN)
        .body(many)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let body = r.text().await.unwrap();
    assert!(body.len() < 32 * 1024, "the answer is {} bytes", body.len());
    assert!(body.contains("more"), "{body}");
    n.stop().await;
}

/// A company at the role limit (10,000 seats, a file past the envelope
/// limit) is applied by an admin through the route `crewlet apply` uses,
/// and the node answers `/health` meanwhile. Its seats ask for a label no
/// node has, so nothing is started.
#[tokio::test]
async fn a_10000_seat_company_is_applied_by_an_admin_while_health_answers() {
    let n = HttpNode::start().await;
    let mut file = String::from("[company]\nname = \"Large\"\n");
    for i in 0..crewlet::config::MAX_ROLES {
        file.push_str(&format!(
            "[[roles]]\nhandle = \"seat-{i:05}\"\nplacement = {{ labels = [\"elsewhere\"] }}\n"
        ));
    }
    assert!(
        file.len() > crewlet::web::LARGE_BODY,
        "{} bytes",
        file.len()
    );
    let r = apply_while_health_answers(&n, file).await;
    assert_eq!(r.status(), StatusCode::OK);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["revision"], 2, "{v}");
    let active = crewlet::company::active(&**n.running().engine.store())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(active.roles.len(), crewlet::config::MAX_ROLES);
    assert!(
        n.audit_log()
            .await
            .iter()
            .any(|e| e["action"] == "company.apply"
                && e["reason"] == "revision 2: 10000 seats"
                && e["result"] == "ok"),
        "the apply is audited"
    );
    n.stop().await;
}

#[tokio::test]
async fn an_envelope_id_or_type_with_control_bytes_is_refused_naming_the_field() {
    let n = HttpNode::start().await;
    for (envelope, field) in [
        (json!({"id": "a\r\nb", "type": "task_assigned"}), "`id`"),
        (json!({"id": "a\u{0}b", "type": "task_assigned"}), "`id`"),
        (json!({"id": "ok-1", "type": "task\nassigned"}), "`type`"),
    ] {
        let r = send(&n, OPS_TOKEN, &envelope).await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{envelope}");
        let v: Value = r.json().await.unwrap();
        assert!(v["error"].as_str().unwrap().contains(field), "{v}");
    }
    n.stop().await;
}

#[tokio::test]
async fn the_node_sets_from_and_sent_at_whatever_the_caller_wrote() {
    let n = HttpNode::start().await;
    wait_for_alpha(&n).await;
    let r = send(
        &n,
        OPS_TOKEN,
        &json!({"id": "forged-1", "type": "task_assigned", "from": "the-ceo", "sent_at": "1999-01-01T00:00:00Z"}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let effect = wait_for_effect(&n, "forged-1").await;
    let t = &effect["triggers"][0];
    assert_eq!(t["from"], "token:ops", "{effect}");
    assert_ne!(t["sent_at"], "1999-01-01T00:00:00Z", "{effect}");
    n.stop().await;
}

#[tokio::test]
async fn an_audit_row_keeps_a_bounded_copy_of_what_a_caller_typed() {
    let n = HttpNode::start().await;
    let viewer = n.signed_in(VIEWER).await;
    let long = "x".repeat(6000);
    let r = viewer
        .post(n.url("/api/seats/alpha/pause"))
        .body(json!({"reason": long}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let rows = audit_rows(&n).await;
    let row = rows
        .iter()
        .find(|e| e["person"] == VIEWER.0 && e["action"] == "seat.pause")
        .expect("the refusal is audited");
    let kept = row["reason"].as_str().unwrap();
    assert!(
        kept.chars().count() <= crewlet::audit::FIELD_CHARS + 1,
        "{} chars",
        kept.len()
    );
    assert!(kept.ends_with('…'));
    n.stop().await;
}

// ---- 6. Sessions and headers ----

#[tokio::test]
async fn every_answer_carries_the_security_headers_and_api_answers_are_not_stored() {
    let n = HttpNode::start().await;
    let c = n.signed_in(VIEWER).await;
    for path in ["/settings/nodes", "/query/fleet", "/health"] {
        let r = c.get(n.url(path)).send().await.unwrap();
        let h = r.headers();
        let csp = h.get("content-security-policy").unwrap().to_str().unwrap();
        assert!(csp.contains("frame-ancestors 'none'"), "{path}: {csp}");
        assert_eq!(h.get("x-frame-options").unwrap(), "DENY", "{path}");
        assert_eq!(
            h.get("x-content-type-options").unwrap(),
            "nosniff",
            "{path}"
        );
        assert!(h.get("referrer-policy").is_some(), "{path}");
    }
    let r = c.get(n.url("/query/fleet")).send().await.unwrap();
    assert_eq!(r.headers().get("cache-control").unwrap(), "no-store");
    n.stop().await;
}

/// The session cookie a viewer's sign-in on `n` sets.
async fn session_cookie(n: &HttpNode) -> String {
    let r = client()
        .post(n.url("/login"))
        .form(&[("name", VIEWER.0), ("password", VIEWER.1)])
        .send()
        .await
        .unwrap();
    r.headers()
        .get("set-cookie")
        .unwrap()
        .to_str()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn a_node_listening_beyond_loopback_marks_its_session_cookie_secure() {
    let n = HttpNode::start_full(Rig::Test, "", "").await;
    let cookie = session_cookie(&n).await;
    assert!(!cookie.contains("Secure"), "loopback: {cookie}");
    n.stop().await;
    let n = HttpNode::start_listening(Rig::Test, "0.0.0.0:0").await;
    let cookie = session_cookie(&n).await;
    assert!(cookie.contains("Secure"), "{cookie}");
    n.stop().await;
}

/// Read `r`'s body until it ends (true) or `within` passes (false).
async fn ends_within(r: reqwest::Response, within: Duration) -> bool {
    let mut r = r;
    tokio::time::timeout(within, async { while let Ok(Some(_)) = r.chunk().await {} })
        .await
        .is_ok()
}

#[tokio::test]
async fn signing_out_ends_the_event_stream_opened_by_that_session() {
    let n = HttpNode::start().await;
    let c = n.signed_in(VIEWER).await;
    let stream = c.get(n.url("/api/events")).send().await.unwrap();
    assert_eq!(stream.status(), StatusCode::OK);
    let r = c.post(n.url("/logout")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert!(
        ends_within(stream, WAIT).await,
        "the stream kept going after sign-out"
    );
    let r = c.get(n.url("/api/events")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    n.stop().await;
}

/// `name` added by the admin with `role`; their generated password.
async fn add(n: &HttpNode, admin: &reqwest::Client, name: &str, role: &str) -> String {
    let r = admin
        .post(n.url("/api/add_person"))
        .form(&[("name", name), ("role", role)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let v: Value = r.json().await.unwrap();
    v["password"].as_str().unwrap().to_string()
}

/// Sign `name` in with their generated `password` and choose `new`.
async fn first_sign_in(n: &HttpNode, name: &str, password: &str, new: &str) -> reqwest::Client {
    let c = client();
    let r = c
        .post(n.url("/login"))
        .form(&[("name", name), ("password", password), ("next", "/seats")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        location(&r),
        "/account/password?next=/seats",
        "a generated password must be changed first"
    );
    // Until then nothing else answers.
    let r = c.get(n.url("/query/fleet")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let r = c.get(n.url("/seats")).send().await.unwrap();
    assert_eq!(location(&r), "/account/password?next=/seats");
    let r = c
        .post(n.url("/account/password"))
        .form(&[
            ("current", password),
            ("new", new),
            ("confirm", new),
            ("next", "/seats"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(location(&r), "/seats?password_changed=1");
    let r = c.get(n.url("/query/fleet")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    c
}

#[tokio::test]
async fn a_role_change_holds_on_the_next_request_and_a_removal_ends_the_session_and_its_stream() {
    let n = HttpNode::start().await;
    wait_for_alpha(&n).await;
    let admin = n.signed_in(ADMIN).await;
    let password = add(&n, &admin, "alice", "viewer").await;
    let alice = first_sign_in(&n, "alice", &password, "alice's own long password").await;
    let pause = || {
        alice
            .post(n.url("/api/seats/alpha/pause"))
            .body("{}")
            .send()
    };
    assert_eq!(pause().await.unwrap().status(), StatusCode::FORBIDDEN);
    let r = admin
        .post(n.url("/api/set_person_role"))
        .form(&[("name", "alice"), ("role", "operator")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        pause().await.unwrap().status(),
        StatusCode::OK,
        "no new sign-in needed"
    );

    let stream = alice.get(n.url("/api/events")).send().await.unwrap();
    assert_eq!(stream.status(), StatusCode::OK);
    let r = admin
        .post(n.url("/api/remove_person"))
        .form(&[("name", "alice")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(
        ends_within(stream, WAIT).await,
        "the removed person's stream kept going"
    );
    assert_eq!(
        alice
            .get(n.url("/query/fleet"))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::UNAUTHORIZED
    );
    let rows = audit_rows(&n).await;
    for action in ["person.add", "person.set_role", "person.remove"] {
        assert!(
            rows.iter()
                .any(|e| e["person"] == ADMIN.0 && e["action"] == action && e["result"] == "ok"),
            "{action}: {rows:?}"
        );
    }
    n.stop().await;
}

#[tokio::test]
async fn only_an_admin_manages_people_and_people_in_the_file_are_changed_there() {
    let n = HttpNode::start().await;
    let op = n.signed_in(OPERATOR).await;
    for (path, form) in [
        (
            "/api/add_person",
            vec![("name", "mallory"), ("role", "admin")],
        ),
        (
            "/api/set_person_role",
            vec![("name", VIEWER.0), ("role", "admin")],
        ),
        ("/api/reset_password", vec![("name", VIEWER.0)]),
        ("/api/remove_person", vec![("name", VIEWER.0)]),
    ] {
        let r = op.post(n.url(path)).form(&form).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{path}");
        let body = r.text().await.unwrap();
        assert!(body.contains("only admins may"), "{path}: {body}");
    }
    let admin = n.signed_in(ADMIN).await;
    let r = admin
        .post(n.url("/api/remove_person"))
        .form(&[("name", VIEWER.0)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(r.text().await.unwrap().contains("company file"));
    n.stop().await;
}

#[tokio::test]
async fn a_reset_password_must_be_changed_and_a_person_changes_their_own() {
    let n = HttpNode::start().await;
    let admin = n.signed_in(ADMIN).await;
    let first = add(&n, &admin, "bob", "operator").await;
    let bob = first_sign_in(&n, "bob", &first, "bob's first own password").await;
    // A person changes their own password; the old one no longer works.
    let r = bob
        .post(n.url("/account/password"))
        .form(&[
            ("current", "bob's first own password"),
            ("new", "bob's second own password"),
            ("confirm", "bob's second own password"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(location(&r), "/settings/nodes?password_changed=1");
    let r = client()
        .post(n.url("/login"))
        .form(&[("name", "bob"), ("password", "bob's first own password")])
        .send()
        .await
        .unwrap();
    assert!(
        location(&r).starts_with("/login?error=1"),
        "{}",
        location(&r)
    );
    // A short one is refused with the reason.
    let r = bob
        .post(n.url("/account/password"))
        .form(&[
            ("current", "bob's second own password"),
            ("new", "short"),
            ("confirm", "short"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(location(&r), "/account/password?error=length");
    // An admin resets it: bob must choose a new one at the next sign-in.
    let r = admin
        .post(n.url("/api/reset_password"))
        .form(&[("name", "bob")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let v: Value = r.json().await.unwrap();
    let reset = v["password"].as_str().unwrap().to_string();
    first_sign_in(&n, "bob", &reset, "bob's third own password").await;
    n.stop().await;
}

// ---- The binary, as a user starts it ----

/// A `crewlet run` child with nobody configured, and the first-start
/// password it printed.
async fn first_start() -> (support::process::NodeProcess, String) {
    let node = support::process::NodeProcess::start(
        "[node]\nid = \"node-bin\"\nlisten = \"{listen}\"\ndata_dir = \"{data}\"\n\n[[roles]]\nhandle = \"alpha\"\n",
    );
    let line = node
        .line_with("with password", Duration::from_secs(60))
        .await;
    let password = line
        .split("with password")
        .nth(1)
        .unwrap()
        .trim()
        .to_string();
    node.healthy(Duration::from_secs(60)).await;
    (node, password)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_concurrent_wrong_guesses_leave_the_nodes_memory_where_it_was() {
    let (node, _) = first_start().await;
    // One sign-in first, so what a single check leaves behind is in the
    // baseline.
    let r = client()
        .post(node.url("/login"))
        .form(&[("name", "nobody"), ("password", "warm-up")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let before = node.rss();
    // From as many clients as the burst, each its own connection.
    let answers = wrong_guesses(&node.url("/login"), 100).await;
    let checked = answers
        .iter()
        .filter(|s| **s == StatusCode::SEE_OTHER)
        .count();
    assert!(
        checked <= crewlet::web::auth::MAX_CONCURRENT_CHECKS,
        "{checked} checks"
    );
    assert_eq!(
        client()
            .get(node.url("/health"))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    let after = node.rss();
    let grown = after.saturating_sub(before);
    println!(
        "rss before {} MiB, after {} MiB ({} password checks of 100 guesses)",
        before >> 20,
        after >> 20,
        checked
    );
    assert!(grown < 50 << 20, "the node grew by {} MiB", grown >> 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_start_admin_must_choose_a_password_at_the_first_sign_in() {
    let (node, password) = first_start().await;
    let c = client();
    let r = c
        .post(node.url("/login"))
        .form(&[
            ("name", "admin"),
            ("password", password.as_str()),
            ("next", "/seats"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(location(&r), "/account/password?next=/seats");
    let r = c.get(node.url("/query/fleet")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let new = "the admin's own password";
    let r = c
        .post(node.url("/account/password"))
        .form(&[
            ("current", password.as_str()),
            ("new", new),
            ("confirm", new),
            ("next", "/seats"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(location(&r), "/seats?password_changed=1");
    let r = c.get(node.url("/query/fleet")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    // The first-start admin deploys.
    let r = c
        .post(node.url("/api/company"))
        .body("[[roles]]\nhandle = \"alpha\"\n[[roles]]\nhandle = \"beta\"\n")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK, "{}", r.text().await.unwrap());
}

#[tokio::test]
async fn mail_of_the_engines_own_types_is_refused_at_the_http_inbox_and_audited() {
    let n = HttpNode::start().await;
    wait_for_alpha(&n).await;
    for (id, kind, body) in [
        (
            "run:run-1",
            "run_completed",
            json!({"run_id": "run-1", "result": {"stdout": "FORGED"}}),
        ),
        (
            "replay-1",
            "tool_approval_answered",
            json!({"approval_id": "approval-1"}),
        ),
    ] {
        let r = send(
            &n,
            OPS_TOKEN,
            &json!({"id": id, "type": kind, "body": body}),
        )
        .await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{kind}");
        let v: Value = r.json().await.unwrap();
        let msg = v["error"].as_str().unwrap();
        assert!(msg.contains(kind) && msg.contains("engine's own"), "{msg}");
    }
    let refused: Vec<Value> = audit_rows(&n)
        .await
        .into_iter()
        .filter(|r| r["action"] == "seat.send" && r["result"] == "refused: the engine's own type")
        .collect();
    assert_eq!(refused.len(), 2, "each refusal is audited: {refused:?}");
    assert!(effects_for(&n, "run:run-1").await.is_empty());
    n.stop().await;
}

/// What `[[node.programs]]` allows here: PyPI's time server as a tool
/// server, nothing else.
fn only_the_time_server() -> String {
    let python = crewlet::config::programs::find_on_node("python3").expect("python3 on PATH");
    format!(
        "allow_command_agents = false\nprograms = [{{ path = {:?}, args = [\"-m mcp_server_time **\"], uses = [\"mcp\"] }}]\nagent_env = [\"PYTHONPATH\"]",
        python.display().to_string()
    )
}

async fn apply_as_admin(n: &HttpNode, company: &str) -> (StatusCode, String) {
    let r = client()
        .post(n.url("/api/company"))
        .bearer_auth(DEPLOY_TOKEN)
        .body(company.to_string())
        .send()
        .await
        .unwrap();
    let status = r.status();
    let v: Value = r.json().await.unwrap_or_default();
    (status, v["error"].as_str().unwrap_or_default().to_string())
}

#[tokio::test]
async fn a_company_naming_a_program_the_node_does_not_allow_is_not_applied_naming_role_and_program()
{
    let n = HttpNode::start_full(Rig::Production, &only_the_time_server(), "").await;
    wait_for_alpha(&n).await;
    for (company, names) in [
        // A stdio tool server is a program like a command agent: refused
        // with command agents off and no rule for it.
        (
            "[[roles]]\nhandle = \"alpha\"\n[[roles]]\nhandle = \"shell\"\nmcp = [{ name = \"x\", command = [\"/bin/sh\", \"-c\", \"id > /tmp/pwned\"] }]\n",
            vec!["\"shell\"", "/bin/sh", "tool server \"x\""],
        ),
        // The allowed program with arguments no pattern takes.
        (
            "[[roles]]\nhandle = \"alpha\"\n[[roles]]\nhandle = \"py\"\nmcp = [{ name = \"t\", command = [\"python3\", \"-c\", \"import os; os.system('id')\"] }]\n",
            vec!["\"py\"", "match none of the patterns"],
        ),
        // The node's own binary, named by a path that leads to it.
        (
            "[[roles]]\nhandle = \"alpha\"\n[[roles]]\nhandle = \"self\"\nmcp = [{ name = \"me\", command = [\"/proc/self/exe\", \"run\"] }]\n",
            vec!["\"self\"", "not allowed on this node"],
        ),
    ] {
        let (status, msg) = apply_as_admin(&n, company).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{msg}");
        assert!(msg.contains("nothing was applied"), "{msg}");
        for name in names {
            assert!(msg.contains(name), "{name} in {msg}");
        }
    }
    assert_eq!(n.running().engine.company().revision, 1, "nothing applied");
    assert_eq!(health_seats(&n).await, json!(["alpha"]));
    n.stop().await;
}

#[tokio::test]
async fn a_company_file_cannot_have_node_files_read_or_node_secrets_handed_to_its_agents() {
    let n = HttpNode::start_full(Rig::Production, &only_the_time_server(), "").await;
    wait_for_alpha(&n).await;
    let model = |extra: &str| {
        format!(
            "[[roles]]\nhandle = \"alpha\"\n[[roles]]\nhandle = \"desk\"\nagent = {{ kind = \"model\", base_url = \"https://models.example.com/v1\", model = \"m\"{extra} }}\n"
        )
    };
    for (company, key) in [
        (model(", instructions_file = \"/proc/self/environ\""), "instructions_file"),
        (model(", instructions_file = \"../crewlet.db\""), "instructions_file"),
        (model(", api_key_env = \"AWS_SECRET_ACCESS_KEY\""), "api_key_env"),
        (
            "[[roles]]\nhandle = \"alpha\"\nmcp = [{ name = \"s\", url = \"https://search.example/mcp\", headers_from = { Authorization = \"DATABASE_URL\" } }]\n".to_string(),
            "headers_from",
        ),
    ] {
        let (status, msg) = apply_as_admin(&n, &company).await;
        assert!(status.is_client_error(), "{status}: {msg}");
        assert!(msg.contains(key), "{key} in {msg}");
    }
    assert_eq!(n.running().engine.company().revision, 1, "nothing applied");
    n.stop().await;
}

#[tokio::test]
async fn a_started_node_cannot_be_read_by_its_children_it_is_not_dumpable() {
    let n = HttpNode::start().await;
    assert!(
        crewlet::engine::children::node_process_sealed(),
        "a process of the node's user could read its memory and /proc/<pid>/environ"
    );
    n.stop().await;
}

#[tokio::test]
async fn unknown_bearer_tokens_are_audited_and_slowed_per_address() {
    let n = HttpNode::start().await;
    let mut statuses = Vec::new();
    for i in 0..8 {
        let r = client()
            .get(n.url("/query/fleet"))
            .bearer_auth(format!("guess-{i}"))
            .send()
            .await
            .unwrap();
        statuses.push(r.status());
        if r.status() == StatusCode::TOO_MANY_REQUESTS {
            assert!(r.headers().get("retry-after").is_some());
        }
    }
    assert_eq!(statuses[0], StatusCode::UNAUTHORIZED);
    assert_eq!(
        statuses.last(),
        Some(&StatusCode::TOO_MANY_REQUESTS),
        "guessing is slowed: {statuses:?}"
    );
    let refused: Vec<Value> = audit_rows(&n)
        .await
        .into_iter()
        .filter(|r| r["action"] == "token.refused")
        .collect();
    assert!(
        refused.len() >= 5,
        "each unknown token is audited, with the address: {refused:?}"
    );
    assert!(
        refused.iter().any(|r| r.to_string().contains("127.0.0.1")),
        "{refused:?}"
    );
    n.stop().await;
}

#[tokio::test]
async fn a_password_change_ends_the_persons_other_sessions_and_keeps_this_one() {
    let n = HttpNode::start().await;
    let admin = n.signed_in(ADMIN).await;
    let first = add(&n, &admin, "carol", "operator").await;
    let here = first_sign_in(&n, "carol", &first, "carol's own password one").await;
    // The same person signed in elsewhere (a laptop left open).
    let elsewhere = client();
    let r = elsewhere
        .post(n.url("/login"))
        .form(&[("name", "carol"), ("password", "carol's own password one")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let r = elsewhere.get(n.url("/query/fleet")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r = here
        .post(n.url("/account/password"))
        .form(&[
            ("current", "carol's own password one"),
            ("new", "carol's own password two"),
            ("confirm", "carol's own password two"),
        ])
        .send()
        .await
        .unwrap();
    assert!(
        location(&r).contains("password_changed=1"),
        "{}",
        location(&r)
    );
    let r = here.get(n.url("/query/fleet")).send().await.unwrap();
    assert_eq!(
        r.status(),
        StatusCode::OK,
        "the session that changed it goes on"
    );
    let r = elsewhere.get(n.url("/query/fleet")).send().await.unwrap();
    assert_eq!(
        r.status(),
        StatusCode::UNAUTHORIZED,
        "the other session ended with the old password"
    );
    // An admin's reset ends them all.
    let r = admin
        .post(n.url("/api/reset_password"))
        .form(&[("name", "carol")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r = here.get(n.url("/query/fleet")).send().await.unwrap();
    assert_eq!(
        r.status(),
        StatusCode::UNAUTHORIZED,
        "a reset ends every session"
    );
    n.stop().await;
}
