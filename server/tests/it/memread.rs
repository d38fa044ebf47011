//! Reads of a seat's memory answered by its holder (spec § A seat's memory
//! follows it: "A read is answered by the holder"), on the in-process twin
//! and on a real nats-server: a read served anywhere is the holder's copy
//! and says who answered; a seat nobody holds is empty and names no holder;
//! a silent or hydrating holder is unavailable, never empty; the overview
//! is one request per holder and its coverage names who did not answer.

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use app::api::{
    MemoryAnswer as SeatAnswer, MemoryAnswerer as Answerer, MemoryCounts, MemoryHolder as Holder,
    MemoryOverview, MemoryUnavailable as Unavailable,
};
use crewlet::memory::SeatMemory;
use crewlet::memory::memread::{self, MemRead, TwinScatter};
use crewlet::queue::{Attachment, Handler};
use crewlet::seat::host::{Fence, HookError, Phase, SeatContext, SeatHooks};
use futures::StreamExt;
use support::turnfleet::*;
use tokio::sync::watch;

both!(
    a_read_served_by_a_non_holder_is_answered_by_the_holder_and_says_who,
    a_seat_nobody_holds_answers_empty_naming_no_holder,
    a_silent_holder_is_unavailable_after_the_budget_not_empty,
    the_overview_is_one_request_per_holder_and_its_coverage_names_a_silent_holder,
    a_holder_still_hydrating_answers_unavailable,
);

const WAIT: Duration = Duration::from_secs(20);
/// The budget of the tests that wait for a silent holder.
const SHORT: Duration = Duration::from_millis(300);

fn phase(n: &Node, handle: &str) -> Option<Phase> {
    n.engine
        .host()
        .status()
        .into_iter()
        .find(|s| s.handle == handle)
        .map(|s| s.phase)
}

fn attached(n: &Node, handle: &str) -> bool {
    phase(n, handle) == Some(Phase::Attached)
}

/// A memory reader on `n` with its own budget (it answers for nothing:
/// the node's own reader does).
fn asker(n: &Node, budget: Duration) -> MemRead {
    MemRead::new(
        n.engine.clone(),
        n.turns.memory().clone(),
        n.scatter.clone(),
        budget,
    )
}

fn diary_texts(m: &SeatMemory) -> Vec<String> {
    m.diary
        .iter()
        .map(|r| r["content"].as_str().unwrap_or_default().to_string())
        .collect()
}

async fn holder_of(n: &Node, handle: &str) -> Holder {
    let l = n
        .store
        .lease(&format!("seat:{handle}"))
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{handle} is held"));
    Holder {
        node_id: l.preferred,
        incarnation: l.owner,
        epoch: l.epoch,
    }
}

async fn a_read_served_by_a_non_holder_is_answered_by_the_holder_and_says_who(f: Fleet) {
    let a = f.node("a", &[pinned("s0", "a")]).await;
    let b = f.node("b", &[]).await;
    f.until("a attaches s0", WAIT, || attached(&a, "s0")).await;
    let m = a.turns.memory();
    m.diary_write("s0", "the client prefers mornings", None)
        .await
        .unwrap();
    m.episode_write("s0", Some("w1"), "shipped the quarterly report", "t1")
        .await
        .unwrap();
    m.conversation_add("s0", "thread-1", Some("m1"), "bob", "hello")
        .await
        .unwrap();
    // b kept a copy from some earlier tenure: never the answer.
    b.turns
        .memory()
        .diary_write("s0", "a stale note b kept", None)
        .await
        .unwrap();
    let holder = holder_of(&a, "s0").await;
    assert_eq!(holder.node_id, "a");
    assert_eq!(holder.incarnation, a.incarnation());

    let remote = b.memread.read("s0").await.unwrap();
    let SeatAnswer::Held {
        handle,
        holder: h,
        answered_by,
        memory,
    } = &remote
    else {
        panic!("the holder's copy, got {remote:?}");
    };
    assert_eq!(handle, "s0");
    assert_eq!(h, &holder);
    assert_eq!(
        answered_by,
        &Answerer {
            node_id: "a".into(),
            incarnation: a.incarnation().into(),
            epoch: Some(holder.epoch),
            local: false,
        }
    );
    assert_eq!(diary_texts(memory), vec!["the client prefers mornings"]);
    assert_eq!(memory.episodes.len(), 1);
    assert_eq!(
        memory.episodes[0]["summary"],
        "shipped the quarterly report"
    );
    assert_eq!(memory.conversations.len(), 1);
    assert_eq!(memory.conversations[0]["text"], "hello");

    // Asked on the holder itself: its own store, the same copy.
    let local = a.memread.read("s0").await.unwrap();
    assert_eq!(local.memory(), Some(memory));
    assert_eq!(
        local.answered_by(),
        &Answerer {
            node_id: "a".into(),
            incarnation: a.incarnation().into(),
            epoch: Some(holder.epoch),
            local: true,
        }
    );
    let v = serde_json::to_value(&remote).unwrap();
    assert_eq!(v["state"], "held");
    assert_eq!(v["answered_by"]["node_id"], "a");
    assert_eq!(v["answered_by"]["local"], false);
}

async fn a_seat_nobody_holds_answers_empty_naming_no_holder(f: Fleet) {
    let a = f
        .node("a", &[pinned("ghost", "nobody"), pinned("s0", "a")])
        .await;
    f.until("a attaches s0", WAIT, || attached(&a, "s0")).await;
    // A copy of unknown age in a's store is not the seat's memory.
    a.turns
        .memory()
        .diary_write("ghost", "a copy of unknown age", None)
        .await
        .unwrap();
    assert!(a.store.lease("seat:ghost").await.unwrap().is_none());

    let r = a.memread.read("ghost").await.unwrap();
    let SeatAnswer::Unheld {
        handle,
        answered_by,
        memory,
    } = &r
    else {
        panic!("unheld, got {r:?}");
    };
    assert_eq!(handle, "ghost");
    assert_eq!(memory, &SeatMemory::default());
    assert!(r.holder().is_none());
    assert_eq!(
        answered_by,
        &Answerer {
            node_id: "a".into(),
            incarnation: a.incarnation().into(),
            epoch: None,
            local: true,
        }
    );
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["state"], "unheld");
    assert!(v.get("holder").is_none(), "{v}");

    let o = a.memread.overview().await.unwrap();
    assert_eq!(o.unheld(), vec!["ghost"]);
    assert_eq!(
        o.seat("ghost").unwrap().memory(),
        Some(&MemoryCounts::default())
    );
}

async fn a_silent_holder_is_unavailable_after_the_budget_not_empty(f: Fleet) {
    let a = f.node("a", &[pinned("s0", "a")]).await;
    let b = f.node("b", &[]).await;
    f.until("a attaches s0", WAIT, || attached(&a, "s0")).await;
    a.turns
        .memory()
        .diary_write("s0", "written on a", None)
        .await
        .unwrap();
    b.turns
        .memory()
        .diary_write("s0", "a stale note b kept", None)
        .await
        .unwrap();
    let holder = holder_of(&a, "s0").await;
    let reader = asker(&b, SHORT);

    // The holder dies: its lease lives until the TTL, and nothing answers
    // for its incarnation.
    a.engine.crash().await;
    assert_eq!(holder_of(&b, "s0").await, holder, "the lease outlives a");
    let r = reader.read("s0").await.unwrap();
    assert!(r.memory().is_none(), "never empty: {r:?}");
    assert_eq!(r.holder(), Some(&holder));
    assert!(
        matches!(
            r.unavailable(),
            Some(Unavailable::NoResponder | Unavailable::Silent { .. })
        ),
        "{r:?}"
    );
    assert!(r.answered_by().local);

    // A holder whose process still takes requests but never answers: the
    // read waits the budget, then says so.
    let _wedged = b
        .scatter
        .listen(&memread::subject(&holder.incarnation))
        .await
        .unwrap();
    let asked = Instant::now();
    let r = reader.read("s0").await.unwrap();
    let waited = asked.elapsed();
    assert!(waited >= SHORT, "answered after {waited:?}");
    assert!(waited < SCATTER_BUDGET, "answered after {waited:?}");
    let SeatAnswer::Unavailable {
        handle,
        holder: h,
        answered_by,
        reason,
        why,
    } = &r
    else {
        panic!("unavailable, got {r:?}");
    };
    assert_eq!(handle, "s0");
    assert_eq!(h, &holder);
    assert_eq!(reason, &Unavailable::Silent { budget_ms: 300 });
    assert_eq!(why, "the holder a did not answer within 300 ms");
    assert_eq!(answered_by.node_id, "b");
    assert!(answered_by.local);
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["state"], "unavailable");
    assert_eq!(v["holder"]["node_id"], "a");
    assert!(v.get("memory").is_none(), "{v}");
}

/// The requests put on the broker (NATS: seen by a subscriber of
/// `crewlet.memread.>`; the twin: kept by its registry), by incarnation.
enum Requests {
    Twin(TwinScatter, usize),
    Nats(async_nats::Subscriber),
}

impl Requests {
    async fn watch(f: &Fleet) -> Requests {
        match &f.scatter {
            Some(s) => Requests::Twin(s.clone(), s.asked().len()),
            None => {
                let c = async_nats::connect(f.server.as_ref().unwrap().url())
                    .await
                    .unwrap();
                let sub = c
                    .subscribe(format!("{}.>", memread::SUBJECT_PREFIX))
                    .await
                    .unwrap();
                c.flush().await.unwrap();
                Requests::Nats(sub)
            }
        }
    }

    /// Requests per incarnation since the last call, once every request
    /// `asker` made has arrived.
    async fn asked(&mut self, asker: &Node) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        match self {
            Requests::Twin(s, from) => {
                let all = s.asked();
                let prefix = format!("{}.", memread::SUBJECT_PREFIX);
                for subject in &all[*from..] {
                    let i = subject.strip_prefix(&prefix).unwrap_or(subject);
                    *out.entry(i.to_string()).or_default() += 1;
                }
                *from = all.len();
            }
            Requests::Nats(sub) => {
                // What one connection publishes reaches a subscriber in
                // order: the marker comes after every request before it.
                let marker = memread::subject(&format!("end-{}", uuid::Uuid::new_v4()));
                let client = asker.client.as_ref().unwrap();
                client.publish(marker.clone(), "".into()).await.unwrap();
                client.flush().await.unwrap();
                loop {
                    let m = tokio::time::timeout(WAIT, sub.next())
                        .await
                        .expect("the marker arrives")
                        .unwrap();
                    if m.subject.as_str() == marker {
                        break;
                    }
                    if m.reply.is_some() {
                        let inc = m
                            .subject
                            .as_str()
                            .strip_prefix(&format!("{}.", memread::SUBJECT_PREFIX))
                            .unwrap()
                            .to_string();
                        *out.entry(inc).or_default() += 1;
                    }
                }
            }
        }
        out
    }
}

fn counts(o: &MemoryOverview, handle: &str) -> MemoryCounts {
    *o.seat(handle)
        .and_then(|s| s.memory())
        .unwrap_or_else(|| panic!("{handle} has counts: {o:?}"))
}

async fn the_overview_is_one_request_per_holder_and_its_coverage_names_a_silent_holder(f: Fleet) {
    let roles = [
        pinned("a0", "a"),
        pinned("a1", "a"),
        pinned("b0", "b"),
        pinned("b1", "b"),
        pinned("b2", "b"),
        pinned("c0", "c"),
        pinned("c1", "c"),
        pinned("ghost", "nobody"),
    ];
    let a = f.node("a", &roles).await;
    let b = f.node("b", &[]).await;
    let c = f.node("c", &[]).await;
    f.until("every seat is attached on its node", WAIT, || {
        ["a0", "a1"].iter().all(|h| attached(&a, h))
            && ["b0", "b1", "b2"].iter().all(|h| attached(&b, h))
            && ["c0", "c1"].iter().all(|h| attached(&c, h))
    })
    .await;
    a.turns
        .memory()
        .diary_write("a0", "a note", None)
        .await
        .unwrap();
    let mb = b.turns.memory();
    mb.diary_write("b0", "one", None).await.unwrap();
    mb.diary_write("b0", "two", None).await.unwrap();
    mb.episode_write("b0", Some("w1"), "did the work", "t1")
        .await
        .unwrap();
    c.turns
        .memory()
        .conversation_add("c0", "thread-1", Some("m1"), "bob", "hi")
        .await
        .unwrap();

    let mut requests = Requests::watch(&f).await;
    let o = a.memread.overview().await.unwrap();
    let asked = requests.asked(&a).await;
    assert_eq!(
        asked,
        BTreeMap::from([
            (b.incarnation().to_string(), 1),
            (c.incarnation().to_string(), 1)
        ]),
        "one request per other holder, none to itself"
    );
    let handles: Vec<&str> = o.seats.iter().map(|s| s.handle()).collect();
    assert_eq!(handles, ["a0", "a1", "b0", "b1", "b2", "c0", "c1", "ghost"]);
    assert_eq!(counts(&o, "a0").diary, 1);
    assert_eq!(counts(&o, "a0").total(), 1);
    assert_eq!((counts(&o, "b0").diary, counts(&o, "b0").episodes), (2, 1));
    assert_eq!(counts(&o, "b0").total(), 3);
    assert_eq!(counts(&o, "b1").total(), 0);
    assert_eq!(counts(&o, "c0").conversations, 1);
    assert!(o.seat("a0").unwrap().answered_by().local);
    assert_eq!(o.seat("b2").unwrap().answered_by().node_id, "b");
    assert!(!o.seat("b2").unwrap().answered_by().local);
    assert_eq!(o.seat("c1").unwrap().answered_by().node_id, "c");
    assert_eq!(o.unheld(), vec!["ghost"]);
    let answered: Vec<(&str, bool, Vec<String>)> = o
        .coverage
        .answered
        .iter()
        .map(|h| (h.node_id.as_str(), h.local, h.seats.clone()))
        .collect();
    assert_eq!(answered.len(), 3, "{:?}", o.coverage);
    assert!(answered.contains(&("a", true, vec!["a0".into(), "a1".into()])));
    assert!(answered.contains(&("b", false, vec!["b0".into(), "b1".into(), "b2".into()])));
    assert!(answered.contains(&("c", false, vec!["c0".into(), "c1".into()])));
    assert!(o.coverage.unanswered.is_empty(), "{:?}", o.coverage);

    // c dies; its leases live on until the TTL.
    let c_holder = holder_of(&a, "c0").await;
    c.engine.crash().await;
    assert_eq!(holder_of(&a, "c0").await, c_holder);
    let o = asker(&a, SHORT).overview().await.unwrap();
    let asked = requests.asked(&a).await;
    assert_eq!(
        asked,
        BTreeMap::from([
            (b.incarnation().to_string(), 1),
            (c.incarnation().to_string(), 1)
        ])
    );
    assert_eq!(o.coverage.unanswered.len(), 1, "{:?}", o.coverage);
    let silent = &o.coverage.unanswered[0];
    assert_eq!(silent.node_id, "c");
    assert_eq!(silent.incarnation, c_holder.incarnation);
    assert_eq!(silent.seats, vec!["c0".to_string(), "c1".to_string()]);
    assert!(
        matches!(
            silent.reason,
            Some(Unavailable::NoResponder | Unavailable::Silent { budget_ms: 300 })
        ),
        "{silent:?}"
    );
    assert!(silent.why.as_deref().unwrap().starts_with("the holder c "));
    for h in ["c0", "c1"] {
        let s = o.seat(h).unwrap();
        assert!(s.memory().is_none(), "{h} is unavailable, not empty: {s:?}");
        assert_eq!(s.holder().unwrap().node_id, "c");
    }
    assert_eq!(counts(&o, "b0").total(), 3);
    assert_eq!(counts(&o, "a0").total(), 1);
    assert_eq!(o.unheld(), vec!["ghost"]);
    let answered: Vec<&str> = o
        .coverage
        .answered
        .iter()
        .map(|h| h.node_id.as_str())
        .collect();
    assert!(
        answered.contains(&"a") && answered.contains(&"b"),
        "{answered:?}"
    );
}

/// The turn engine's hooks, with memory hydration held until the gate
/// opens.
struct HeldHydration {
    turns: Arc<crewlet::engine::runtime::TurnEngine>,
    gate: watch::Receiver<bool>,
    entered: Arc<AtomicBool>,
}

#[async_trait::async_trait]
impl SeatHooks for HeldHydration {
    async fn start_children(&self, seat: &SeatContext) -> Result<(), HookError> {
        self.turns.start_children(seat).await
    }
    async fn hydrate_memory(&self, seat: &SeatContext) -> Result<(), HookError> {
        self.entered.store(true, Ordering::SeqCst);
        let mut gate = self.gate.clone();
        let _ = gate.wait_for(|open| *open).await;
        self.turns.hydrate_memory(seat).await
    }
    async fn attach_reflect(&self, seat: &SeatContext) -> Result<Option<Attachment>, HookError> {
        self.turns.attach_reflect(seat).await
    }
    async fn attach_control(&self, seat: &SeatContext) -> Result<Option<Attachment>, HookError> {
        self.turns.attach_control(seat).await
    }
    async fn pause_holds(&self, seat: &SeatContext) -> Result<Vec<String>, HookError> {
        self.turns.pause_holds(seat).await
    }
    fn inbox_handler(&self, seat: &SeatContext, fence: Fence) -> Arc<dyn Handler> {
        self.turns.inbox_handler(seat, fence)
    }
    async fn established(&self, seat: &SeatContext) {
        self.turns.established(seat).await
    }
    async fn release(&self, seat: &SeatContext) -> Result<(), HookError> {
        self.turns.release(seat).await
    }
}

async fn a_holder_still_hydrating_answers_unavailable(f: Fleet) {
    let (open, gate) = watch::channel(false);
    let entered = Arc::new(AtomicBool::new(false));
    let hooks = {
        let entered = entered.clone();
        move |turns| -> Arc<dyn SeatHooks> {
            Arc::new(HeldHydration {
                turns,
                gate,
                entered,
            })
        }
    };
    let a = f.node_with_hooks("a", &[pinned("s0", "a")], hooks).await;
    let b = f.node("b", &[]).await;
    f.until("a is hydrating s0", WAIT, || {
        entered.load(Ordering::SeqCst) && phase(&a, "s0") == Some(Phase::Establishing)
    })
    .await;
    let holder = holder_of(&b, "s0").await;
    assert_eq!(holder.node_id, "a");

    // Asked from a peer: the holder answers that it is hydrating.
    let r = b.memread.read("s0").await.unwrap();
    assert!(r.memory().is_none(), "never empty: {r:?}");
    assert_eq!(r.unavailable(), Some(&Unavailable::Hydrating), "{r:?}");
    assert_eq!(r.holder(), Some(&holder));
    assert_eq!(
        r.answered_by(),
        &Answerer {
            node_id: "a".into(),
            incarnation: a.incarnation().into(),
            epoch: Some(holder.epoch),
            local: false,
        }
    );
    // Asked on the holder itself: the same.
    let r = a.memread.read("s0").await.unwrap();
    assert_eq!(r.unavailable(), Some(&Unavailable::Hydrating), "{r:?}");
    assert!(r.answered_by().local);
    // In the overview a answered: its seat says why it has no counts.
    let o = b.memread.overview().await.unwrap();
    let s = o.seat("s0").unwrap();
    assert_eq!(s.unavailable(), Some(&Unavailable::Hydrating), "{s:?}");
    assert_eq!(o.coverage.answered.len(), 1, "{:?}", o.coverage);
    assert_eq!(o.coverage.answered[0].node_id, "a");

    // Hydration finishes: the holder's copy is the answer.
    open.send(true).unwrap();
    f.until("a attaches s0", WAIT, || attached(&a, "s0")).await;
    a.turns
        .memory()
        .diary_write("s0", "after hydration", None)
        .await
        .unwrap();
    let r = b.memread.read("s0").await.unwrap();
    assert_eq!(
        diary_texts(r.memory().expect("held")),
        vec!["after hydration"]
    );
}

/// Whole nodes as `crewlet run` starts them (`node::start`): a fleet of
/// them needs NATS (a twin node is alone in its process), so this one runs
/// on NATS only.
fn whole_node_config(id: &str, url: &str, dir: &std::path::Path) -> crewlet::config::Config {
    let text = format!(
        r#"
[node]
id = "{id}"
listen = "127.0.0.1:0"
data_dir = "{data}"

[coordination]
type = "embedded-kv"
lease_ttl_seconds = 3
heartbeat_seconds = 1
sweep_seconds = 1

[stream]
type = "nats"
urls = ["{url}"]

[company]
name = "Memory company"

[[roles]]
handle = "s0"
[roles.placement]
nodes = ["node-a"]
[[roles]]
handle = "s1"
[roles.placement]
nodes = ["node-b"]

[[auth.tokens]]
name = "monitoring"
sha256 = "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8"
role = "viewer"
"#,
        data = dir.join(id).display(),
    );
    crewlet::config::Config::parse("fleet.toml", &text, &BTreeMap::new()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_nodes_answer_reads_for_the_seats_they_hold() {
    let server = support::nats::NatsServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let a = crewlet::node::start(whole_node_config("node-a", &server.url(), dir.path()))
        .await
        .unwrap();
    let b = crewlet::node::start(whole_node_config("node-b", &server.url(), dir.path()))
        .await
        .unwrap();
    support::wait_for(
        "each node attaches its seat",
        WAIT,
        Duration::from_millis(20),
        || async {
            let on = |n: &crewlet::node::RunningNode, h: &str| {
                n.engine
                    .host()
                    .status()
                    .iter()
                    .any(|s| s.handle == h && s.phase == Phase::Attached)
            };
            (on(&a, "s0") && on(&b, "s1")).then_some(())
        },
    )
    .await;
    a.turns
        .memory()
        .diary_write("s0", "kept on node-a", None)
        .await
        .unwrap();

    let r = b.memread.read("s0").await.unwrap();
    assert_eq!(
        diary_texts(r.memory().expect("held")),
        vec!["kept on node-a"]
    );
    assert_eq!(r.answered_by().node_id, "node-a");
    assert_eq!(r.answered_by().incarnation, a.info.incarnation.as_str());
    assert!(!r.answered_by().local);

    let o = b.memread.overview().await.unwrap();
    assert_eq!(counts(&o, "s0").diary, 1);
    assert!(o.seat("s1").unwrap().answered_by().local);
    assert_eq!(o.coverage.answered.len(), 2, "{:?}", o.coverage);
    assert!(o.coverage.unanswered.is_empty());

    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}
