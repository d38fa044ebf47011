//! What a seat said and what happened, as the node keeps them for people:
//! `GET /api/seats/{handle}/outbox` (a single node's in-process outbox,
//! readable), `GET /api/events/history` (the fleet's events kept in the
//! node's database, paged newest first, filtered, and outliving a
//! restart), and a server function's answer to a request with no session.

use crate::support;

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::http_node::{HttpNode as TestNode, *};

const WAIT: Duration = Duration::from_secs(20);
/// How often a wait looks again.
const EVERY: Duration = Duration::from_millis(50);

async fn send(n: &TestNode, id: &str) {
    let r = client()
        .post(n.url("/api/seats/alpha/inbox"))
        .bearer_auth(OPS_TOKEN)
        .body(json!({"id": id, "type": "task_assigned", "body": {"text": id}}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK, "{id} sent");
}

async fn get(n: &TestNode, path: &str) -> (StatusCode, Value) {
    let r = client()
        .get(n.url(path))
        .bearer_auth(MONITORING_TOKEN)
        .send()
        .await
        .unwrap();
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Alpha's effects, newest first, once there are `count`.
async fn effects(n: &TestNode, count: usize) -> Vec<Value> {
    support::wait_for(
        &format!("{count} effects of alpha"),
        WAIT,
        EVERY,
        || async {
            let (status, body) = get(n, "/api/seats/alpha/outbox").await;
            assert_eq!(status, StatusCode::OK, "{body}");
            let got = body["effects"].as_array().cloned().unwrap_or_default();
            (got.len() >= count).then_some(got)
        },
    )
    .await
}

#[tokio::test]
async fn a_seats_replies_are_read_from_its_outbox_newest_first_by_anyone_signed_in() {
    let n = TestNode::start().await;
    send(&n, "out-1").await;
    effects(&n, 1).await;
    send(&n, "out-2").await;
    let got = effects(&n, 2).await;
    let answered: Vec<&Value> = got.iter().map(|e| &e["trigger_ids"][0]).collect();
    assert_eq!(answered, [&json!("out-2"), &json!("out-1")], "newest first");
    assert_eq!(got[0]["text"], "echo of out-2");
    assert_eq!(got[0]["kind"], "post_outbox");
    assert!(
        got[0]["at"].as_str().is_some_and(|a| a.ends_with('Z')),
        "{}",
        got[0]
    );
    let (_, one) = get(&n, "/api/seats/alpha/outbox?limit=1").await;
    assert_eq!(one["effects"].as_array().unwrap().len(), 1);
    let (status, body) = get(&n, "/api/seats/nobody/outbox").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let unsigned = client()
        .get(n.url("/api/seats/alpha/outbox"))
        .send()
        .await
        .unwrap();
    assert_eq!(unsigned.status(), StatusCode::UNAUTHORIZED);
    n.stop().await;
}

/// The names of the kept events `path` answers, newest first.
async fn names(n: &TestNode, path: &str) -> (Vec<String>, Value) {
    let (status, body) = get(n, path).await;
    assert_eq!(status, StatusCode::OK, "{path}: {body}");
    let names = body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect();
    (names, body)
}

#[tokio::test]
async fn the_kept_events_page_newest_first_by_seat_and_outlive_a_restart() {
    let n = TestNode::start().await;
    send(&n, "kept-1").await;
    effects(&n, 1).await;
    // Kept once written (the history writes in batches as events come).
    let (seen, page) = support::wait_for("alpha's turn_completed kept", WAIT, EVERY, || async {
        let (seen, page) = names(&n, "/api/events/history?seat=alpha").await;
        seen.iter()
            .any(|s| s == "turn_completed")
            .then_some((seen, page))
    })
    .await;
    let ids: Vec<u64> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_u64().unwrap())
        .collect();
    assert!(ids.windows(2).all(|w| w[0] > w[1]), "newest first: {ids:?}");
    assert!(seen.iter().any(|s| s == "seat_claimed"), "{seen:?}");
    assert!(
        page["events"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["data"].as_str().unwrap().contains(r#""seat":"alpha""#)),
        "only alpha's"
    );
    assert!(
        !seen.iter().any(|s| s == "seat_sweep"),
        "per-pass noise left out"
    );
    // A page of two, then the page before its last.
    let (two, first) = names(&n, "/api/events/history?seat=alpha&limit=2").await;
    assert_eq!((two.len(), first["more"].as_bool()), (2, Some(true)));
    let last = first["events"][1]["id"].as_u64().unwrap();
    let (_, older) = names(&n, &format!("/api/events/history?seat=alpha&before={last}")).await;
    assert_eq!(older["events"][0]["id"].as_u64(), ids.get(2).copied());
    let (status, _) = get(&n, "/api/events/history?colour=red").await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "an unknown parameter is refused"
    );

    let n = n.restart().await;
    support::wait_for("both runs' claims of alpha kept", WAIT, EVERY, || async {
        let (_, after) = names(&n, "/api/events/history?seat=alpha&type=seat_claimed").await;
        (after["events"].as_array().unwrap().len() >= 2).then_some(())
    })
    .await;
    let (kept, _) = names(&n, "/api/events/history?seat=alpha&type=turn_completed").await;
    assert_eq!(
        kept,
        ["turn_completed"],
        "the turn before the restart is still kept"
    );
    n.stop().await;
}

#[tokio::test]
async fn a_server_function_asked_without_a_session_answers_not_signed_in() {
    let n = TestNode::start().await;
    let r = client().post(n.url("/api/whoami")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(r.text().await.unwrap(), r#""NotSignedIn""#);
    // A JSON endpoint keeps its own shape.
    let r = client().get(n.url("/query/fleet")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert!(r.json::<Value>().await.unwrap()["error"].is_string());
    n.stop().await;
}
