//! The node priority order and "move this seat now" over HTTP, against a
//! real node in this process (docs/http-and-cli.md § HTTP): who may read and change the
//! order, compare-and-set saves (409 on a stale revision), moves refused
//! with the reason (a node outside the seat's placement is named as such),
//! and every action audited and announced on the event bus.

use crate::support;

use std::time::Duration;

use crewlet::coord::{Claim, ClaimRequest};
use crewlet::events::{Event, FleetEvent};
use reqwest::StatusCode;
use serde_json::{Value, json};

use support::http_node::{DEPLOY_TOKEN, HttpNode, MONITORING_TOKEN, OPERATOR, VIEWER};

/// One node, `node-http`, with no labels: seat `alpha` may run anywhere,
/// seat `gpu` only on a node labelled `gpu`.
async fn start() -> HttpNode {
    HttpNode::start_with(
        r#"
[[roles]]
handle = "gpu"
placement = { labels = ["gpu"] }
"#,
    )
    .await
}

/// The order as `c` reads it, once this node's presence is in it.
async fn order_with_this_node(n: &HttpNode, c: &reqwest::Client) -> Value {
    support::wait_for(
        "this node's presence in the order",
        Duration::from_secs(15),
        Duration::from_millis(50),
        || async {
            let r = c.get(n.url("/api/nodes/order")).send().await.unwrap();
            assert_eq!(r.status(), StatusCode::OK);
            let v: Value = r.json().await.unwrap();
            v["effective"]
                .as_array()
                .is_some_and(|a| a.iter().any(|x| x == "node-http"))
                .then_some(v)
        },
    )
    .await
}

/// Until `alpha` is held here (so that a move is judged against a holder).
async fn alpha_held(n: &HttpNode) {
    let engine = n.running().engine.clone();
    support::wait_for(
        "alpha to be held",
        Duration::from_secs(15),
        Duration::from_millis(50),
        || {
            let engine = engine.clone();
            async move {
                engine
                    .host()
                    .held()
                    .contains(&"alpha".to_string())
                    .then_some(())
            }
        },
    )
    .await
}

/// The audit rows for `action`, oldest first.
async fn audit_rows(n: &HttpNode, action: &str) -> Vec<Value> {
    let mut log = n.audit_log().await;
    log.retain(|e| e["action"] == action);
    log.reverse();
    log
}

fn events_so_far(rx: &mut tokio::sync::broadcast::Receiver<FleetEvent>) -> Vec<Event> {
    let mut out = Vec::new();
    while let Ok(e) = rx.try_recv() {
        out.push(e.event);
    }
    out
}

async fn put_order(c: &reqwest::Client, n: &HttpNode, body: Value) -> (StatusCode, Value) {
    let r = c
        .put(n.url("/api/nodes/order"))
        .json(&body)
        .send()
        .await
        .unwrap();
    (r.status(), r.json().await.unwrap())
}

async fn post_move(
    c: &reqwest::Client,
    n: &HttpNode,
    seat: &str,
    body: Value,
) -> (StatusCode, Value) {
    let r = c
        .post(n.url(&format!("/api/seats/{seat}/move")))
        .json(&body)
        .send()
        .await
        .unwrap();
    (r.status(), r.json().await.unwrap())
}

/// A second live node, `node-b` (a presence lease in this node's store), so
/// that a move has somewhere to go.
async fn second_node(n: &HttpNode) {
    let store = n.running().engine.store().clone();
    match store
        .claim(ClaimRequest::new("node:node-b", "node-b:0001", "node-b"))
        .await
    {
        Ok(Claim::Won(_)) => {}
        other => panic!("node-b's presence was not claimed: {other:?}"),
    }
}

#[tokio::test]
async fn any_signed_in_person_reads_the_order_and_an_unsigned_one_gets_401() {
    let n = start().await;
    let r = reqwest::Client::new()
        .get(n.url("/api/nodes/order"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let viewer = n.signed_in(VIEWER).await;
    let v = order_with_this_node(&n, &viewer).await;
    assert_eq!(
        v,
        json!({
            "saved": [],
            "effective": ["node-http"],
            "set_by": null,
            "set_at": null,
            "revision": null,
        })
    );
    n.stop().await;
}

#[tokio::test]
async fn a_viewer_cannot_save_the_order_or_move_a_seat_and_both_refusals_are_audited() {
    let n = start().await;
    let viewer = n.signed_in(VIEWER).await;
    order_with_this_node(&n, &viewer).await;
    let (status, v) = put_order(
        &viewer,
        &n,
        json!({"nodes": ["node-http"], "revision": null}),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("only operators may change the node order"),
        "{v}"
    );
    let (status, v) = post_move(
        &viewer,
        &n,
        "alpha",
        json!({"node": "node-http", "reason": "curious"}),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("only operators may move a seat"),
        "{v}"
    );
    // The dashboard's functions refuse a viewer the same way.
    let r = viewer
        .post(n.url("/api/save_node_order"))
        .json(&json!({"nodes": ["node-http"], "revision": null}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let r = viewer
        .post(n.url("/api/move_seat"))
        .form(&[("handle", "alpha"), ("node", "node-http"), ("reason", "x")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);

    let store = n.running().engine.store().clone();
    assert!(
        crewlet::seat::ranking::read(&*store)
            .await
            .unwrap()
            .is_none(),
        "nothing was saved"
    );
    assert!(
        crewlet::seat::moves::standing(&*store)
            .await
            .unwrap()
            .is_empty(),
        "nothing was requested"
    );
    let orders = audit_rows(&n, "node_order.save").await;
    assert_eq!(orders.len(), 2, "{orders:?}");
    for row in &orders {
        assert_eq!(row["person"], "victor");
        assert_eq!(row["result"], "refused: not an operator");
    }
    let moves = audit_rows(&n, "seat.move").await;
    assert_eq!(moves.len(), 2, "{moves:?}");
    assert_eq!(moves[0]["person"], "victor");
    assert_eq!(moves[0]["seat"], "alpha");
    assert_eq!(moves[0]["reason"], "curious");
    assert!(
        moves[0]["result"]
            .as_str()
            .unwrap()
            .starts_with("refused: not an operator"),
        "{moves:?}"
    );
    n.stop().await;
}

#[tokio::test]
async fn an_operator_saves_the_order_it_is_audited_and_announced_and_a_stale_revision_is_409() {
    let n = start().await;
    let mut events = n.running().engine.events().subscribe();
    let op = n.signed_in(OPERATOR).await;
    order_with_this_node(&n, &op).await;
    second_node(&n).await;

    let (status, v) = put_order(
        &op,
        &n,
        json!({"nodes": ["node-b", "node-http"], "revision": null}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["saved"], json!(["node-b", "node-http"]));
    assert_eq!(v["effective"], json!(["node-b", "node-http"]));
    assert_eq!(v["set_by"], "olivia");
    assert!(v["set_at"].as_str().is_some_and(|s| !s.is_empty()), "{v}");
    let first = v["revision"].as_u64().expect("a revision");

    // Anybody reading it now sees the same.
    let viewer = n.signed_in(VIEWER).await;
    let read: Value = viewer
        .get(n.url("/api/nodes/order"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(read, v);

    // A save against what was read before (no order) is stale.
    let (status, stale) =
        put_order(&op, &n, json!({"nodes": ["node-http"], "revision": null})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{stale}");
    assert!(
        stale["error"].as_str().unwrap().contains("reload"),
        "{stale}"
    );
    // Against the revision read, it is saved.
    let (status, v) = put_order(
        &op,
        &n,
        json!({"nodes": ["node-http", "node-b"], "revision": first}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["effective"], json!(["node-http", "node-b"]));
    assert!(v["revision"].as_u64().unwrap() > first);

    let changed: Vec<Event> = events_so_far(&mut events)
        .into_iter()
        .filter(|e| matches!(e, Event::NodeOrderChanged { .. }))
        .collect();
    assert_eq!(
        changed,
        vec![
            Event::NodeOrderChanged {
                nodes: vec!["node-b".into(), "node-http".into()],
                by: "olivia".into(),
            },
            Event::NodeOrderChanged {
                nodes: vec!["node-http".into(), "node-b".into()],
                by: "olivia".into(),
            },
        ]
    );
    let rows = audit_rows(&n, "node_order.save").await;
    let got: Vec<(&str, &str, &str)> = rows
        .iter()
        .map(|r| {
            (
                r["person"].as_str().unwrap(),
                r["reason"].as_str().unwrap(),
                r["result"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(got.len(), 3, "{rows:?}");
    assert_eq!(got[0].0, "olivia");
    assert_eq!(got[0].1, "order: node-b, node-http");
    assert!(got[0].2.starts_with("saved"), "{got:?}");
    assert_eq!(
        got[1],
        (
            "olivia",
            "order: node-http",
            "refused: saved by somebody else since it was read"
        )
    );
    assert!(got[2].2.starts_with("saved"), "{got:?}");
    n.stop().await;
}

#[tokio::test]
async fn a_repeated_or_empty_node_id_or_a_malformed_body_is_refused_naming_it() {
    let n = start().await;
    let op = n.signed_in(OPERATOR).await;
    let (status, v) = put_order(
        &op,
        &n,
        json!({"nodes": ["node-http", "node-b", "node-http"], "revision": null}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        v["error"].as_str().unwrap().contains("\"node-http\""),
        "{v}"
    );
    let (status, v) = put_order(&op, &n, json!({"nodes": ["node-http", ""]})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(v["error"].as_str().unwrap().contains("entry 2"), "{v}");
    let (status, v) = put_order(&op, &n, json!({"order": ["node-http"]})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(v["error"].as_str().unwrap().contains("nodes"), "{v}");
    let (status, v) = post_move(&op, &n, "alpha", json!({"to": "node-http"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(v["error"].as_str().unwrap().contains("node"), "{v}");
    n.stop().await;
}

#[tokio::test]
async fn a_move_to_a_node_outside_the_seats_placement_is_refused_with_a_reason_naming_the_placement()
 {
    let n = start().await;
    let op = n.signed_in(OPERATOR).await;
    order_with_this_node(&n, &op).await;
    let (status, v) = post_move(
        &op,
        &n,
        "gpu",
        json!({"node": "node-http", "reason": "needs the big card"}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    let msg = v["error"].as_str().unwrap();
    assert!(msg.contains("outside seat \"gpu\"'s placement"), "{msg}");
    assert!(msg.contains("labels gpu"), "{msg}");
    assert!(
        crewlet::seat::moves::standing(&**n.running().engine.store())
            .await
            .unwrap()
            .is_empty()
    );
    let rows = audit_rows(&n, "seat.move").await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["person"], "olivia");
    assert_eq!(rows[0]["seat"], "gpu");
    assert_eq!(rows[0]["reason"], "needs the big card");
    let result = rows[0]["result"].as_str().unwrap();
    assert!(
        result.starts_with("refused:") && result.contains("labels gpu"),
        "{result}"
    );
    n.stop().await;
}

#[tokio::test]
async fn an_operator_moves_a_seat_to_a_live_node_and_it_is_recorded_audited_and_announced() {
    let n = start().await;
    let mut events = n.running().engine.events().subscribe();
    let op = n.signed_in(OPERATOR).await;
    alpha_held(&n).await;
    second_node(&n).await;
    let (status, v) = post_move(
        &op,
        &n,
        "alpha",
        json!({"node": "node-b", "reason": "  node-http is due for maintenance  "}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    assert_eq!(v["seat"], "alpha");
    assert_eq!(v["to"], "node-b");
    assert_eq!(v["by"], "olivia");
    assert_eq!(v["reason"], "node-http is due for maintenance");
    assert!(
        v["requested_at"].as_str().is_some_and(|s| s.contains('T')),
        "{v}"
    );
    assert!(v["until"].as_str().is_some_and(|s| s.contains('T')), "{v}");

    let moved: Vec<Event> = events_so_far(&mut events)
        .into_iter()
        .filter(|e| matches!(e, Event::SeatMoveRequested { .. }))
        .collect();
    assert_eq!(
        moved,
        vec![Event::SeatMoveRequested {
            seat: "alpha".into(),
            to: "node-b".into(),
            by: "olivia".into(),
            reason: "node-http is due for maintenance".into(),
        }]
    );
    let rows = audit_rows(&n, "seat.move").await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["person"], "olivia");
    assert_eq!(rows[0]["seat"], "alpha");
    assert_eq!(rows[0]["reason"], "node-http is due for maintenance");
    assert_eq!(rows[0]["result"], "requested: to node-b");
    n.stop().await;
}

#[tokio::test]
async fn a_move_with_no_reason_to_an_unknown_node_or_where_it_runs_is_400_and_an_unknown_seat_404()
{
    let n = start().await;
    let op = n.signed_in(OPERATOR).await;
    alpha_held(&n).await;
    let cases = [
        (
            "alpha",
            json!({"node": "node-http", "reason": "  "}),
            StatusCode::BAD_REQUEST,
            "reason is required",
        ),
        (
            "alpha",
            json!({"node": "node-zz", "reason": "r"}),
            StatusCode::BAD_REQUEST,
            "not a live node",
        ),
        (
            "alpha",
            json!({"node": "node-http", "reason": "r"}),
            StatusCode::BAD_REQUEST,
            "already runs on node \"node-http\"",
        ),
        (
            "ghost",
            json!({"node": "node-http", "reason": "r"}),
            StatusCode::NOT_FOUND,
            "\"ghost\" is not in the active company",
        ),
    ];
    for (seat, body, want, says) in cases {
        let (status, v) = post_move(&op, &n, seat, body.clone()).await;
        assert_eq!(status, want, "{seat} {body}: {v}");
        let msg = v["error"].as_str().unwrap();
        assert!(msg.contains(says), "{seat} {body}: {msg}");
    }
    // The dashboard's function answers the same refusal text.
    let r = op
        .post(n.url("/api/move_seat"))
        .form(&[("handle", "alpha"), ("node", "node-http"), ("reason", "r")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let body = r.text().await.unwrap();
    assert!(body.contains("already runs on node"), "{body}");
    n.stop().await;
}

#[tokio::test]
async fn bearer_tokens_read_the_order_and_only_an_operator_token_saves_it() {
    let n = start().await;
    let c = reqwest::Client::new();
    let viewer = n.signed_in(VIEWER).await;
    order_with_this_node(&n, &viewer).await;
    let r = c
        .get(n.url("/api/nodes/order"))
        .bearer_auth(MONITORING_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        r.json::<Value>().await.unwrap()["effective"],
        json!(["node-http"])
    );
    let body = json!({"nodes": ["node-http"], "revision": null});
    let r = c
        .put(n.url("/api/nodes/order"))
        .bearer_auth(MONITORING_TOKEN)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let r = c
        .put(n.url("/api/nodes/order"))
        .bearer_auth(DEPLOY_TOKEN)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap()["set_by"], "token:deploy");
    n.stop().await;
}
