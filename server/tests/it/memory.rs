//! A seat's memory follows it (spec § A seat's memory follows it), on the
//! in-process twin and on a real nats-server: a graceful move keeps every
//! row, a crash loses at most one cycle, a duplicate episode collapses on
//! the next replay, the vector rule holds both ways, the rowid-reuse bug
//! stays fixed, a hydration that fails refuses the seat, and a turn's
//! reflection is written where the seat is held.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use crewlet::events::{DetachReason, Event};
use crewlet::memory::changelog::{self, Changelog, NatsChangelog, TwinChangelog};
use crewlet::memory::{Applied, MemoryStore, Table};
use crewlet::queue::{reflect_group, reflect_subject};
use support::turnfleet::*;

const WAIT: Duration = Duration::from_secs(20);

both!(
    a_cycle_publishes_only_what_is_new_and_an_idle_cycle_publishes_nothing,
    one_cycle_publishes_every_seat_with_new_memory_however_many,
    a_seat_moved_gracefully_keeps_every_row,
    a_crash_loses_at_most_one_cycle,
    a_duplicate_episode_written_on_two_nodes_collapses_on_the_next_replay,
    a_carried_vector_fills_a_stale_one_and_a_stale_copy_never_erases_a_filled_one,
    a_hydration_larger_than_one_write_carries_every_row_and_skips_only_the_unreadable,
    deleting_the_newest_diary_note_and_writing_another_still_carries_the_new_one,
    a_hydration_that_fails_refuses_the_seat_and_a_peer_takes_it,
    a_finished_turn_is_reflected_on_by_the_seats_holder_and_written_once,
    a_reflection_wake_published_between_holders_is_written_by_the_next_holder,
);

/// Write one row of every kind for `seat`.
async fn remember_everything(m: &MemoryStore, seat: &str, tag: &str) {
    assert!(
        m.diary_write(seat, &format!("note {tag}"), None)
            .await
            .unwrap()
    );
    assert!(
        m.episode_write(seat, Some(&format!("work-{tag}")), "did it", "turn-1")
            .await
            .unwrap()
    );
    m.counterparty_seen(seat, &format!("alice-{tag}"), Some("w"))
        .await
        .unwrap();
    m.skill_set(seat, &format!("skill-{tag}"), "active")
        .await
        .unwrap();
    assert!(
        m.skill_version_add(seat, &format!("skill-{tag}"), 1, "body")
            .await
            .unwrap()
    );
    m.marker_set(seat, &format!("marker-{tag}"), "done")
        .await
        .unwrap();
    assert!(
        m.conversation_add(seat, "thread-1", Some(&format!("m-{tag}")), "alice", "hi")
            .await
            .unwrap()
    );
}

async fn counts(n: &Node, seat: &str) -> [usize; 7] {
    n.turns
        .memory()
        .seat_memory(seat, 1000)
        .await
        .unwrap()
        .counts()
}

async fn a_seat_moved_gracefully_keeps_every_row(f: Fleet) {
    let mut a = f.node("a", &[echo_role("s0")]).await;
    f.until("a holds s0", WAIT, || a.holds("s0")).await;
    remember_everything(a.turns.memory(), "s0", "1").await;
    // A turn writes its own rows too.
    a.publish("s0", &trigger("E1", serde_json::json!({}))).await;
    f.until("the turn ran", WAIT, || !a.turns_of("E1").is_empty())
        .await;
    let before = counts(&a, "s0").await;
    assert!(before.iter().all(|n| *n >= 1), "{before:?}");
    let b = f.node("b", &[]).await;
    // No cycle ran: the release hook's flush is what carries it.
    a.engine.drain().await;
    f.until("b has s0 established", WAIT, || b.attached("s0"))
        .await;
    let after = counts(&b, "s0").await;
    // The reflection wake may land after the drain's flush on a; what a
    // had when it let go is all on b.
    assert!(
        after.iter().zip(before.iter()).all(|(b, a)| b >= a),
        "a had {before:?}, b has {after:?}"
    );
    assert_eq!(after[1..], before[1..], "every non-diary row moved as is");
}

async fn a_crash_loses_at_most_one_cycle(f: Fleet) {
    let a = f.node("a", &[echo_role("s0")]).await;
    f.until("a holds s0", WAIT, || a.holds("s0")).await;
    remember_everything(a.turns.memory(), "s0", "cycled").await;
    let published = a.turns.flush_memory(&["s0".to_string()]).await;
    assert_eq!(published, 7, "one row of each kind");
    remember_everything(a.turns.memory(), "s0", "lost").await;
    a.engine.crash().await;
    let b = f.node("b", &[]).await;
    f.until("b has s0 established", WAIT, || b.attached("s0"))
        .await;
    assert_eq!(counts(&b, "s0").await, [1; 7], "the last cycle's rows");
    let diary = b.turns.memory().diary("s0", 10).await.unwrap();
    assert_eq!(diary[0].content, "note cycled");
}

async fn a_duplicate_episode_written_on_two_nodes_collapses_on_the_next_replay(f: Fleet) {
    let a = f.node("a", &[echo_role("s0")]).await;
    f.until("a holds s0", WAIT, || a.holds("s0")).await;
    let b = f.node("b", &[]).await;
    // The same unit of work ran on two nodes (the ledger failed open):
    // two episodes under two ids, both carried.
    for n in [&a, &b] {
        assert!(
            n.turns
                .memory()
                .episode_write("s0", Some("work-K"), "did K", "turn")
                .await
                .unwrap()
        );
        assert_eq!(
            changelog::flush(n.turns.memory(), &*n.changelog, "s0")
                .await
                .unwrap(),
            1
        );
    }
    let carried = a.changelog.replay("s0").await.unwrap();
    assert_eq!(
        carried
            .iter()
            .filter(|r| r.table == Table::Episodes)
            .count(),
        2
    );
    let mut c = f.node("c", &[]).await;
    a.engine.drain().await;
    b.engine.drain().await;
    f.until("c has s0 established", WAIT, || c.attached("s0"))
        .await;
    let episodes = c.turns.memory().episodes("s0", 10).await.unwrap();
    assert_eq!(
        episodes.len(),
        1,
        "one episode per unit of work: {episodes:?}"
    );
    assert!(
        c.matching(|e| match e {
            Event::SeatDetached { reason, .. } if *reason == DetachReason::HookFailed => Some(()),
            _ => None,
        })
        .is_empty(),
        "the collision is skipped, not an error"
    );
}

/// Two nodes' stores over one changelog of the fleet's kind, outside any
/// seat engine: the vector rule as hydration applies it.
async fn stores(
    f: &Fleet,
) -> (
    MemoryStore,
    MemoryStore,
    Arc<dyn Changelog>,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().unwrap();
    let open = |name: &str| {
        let p = dir.path().join(name);
        async move { crewlet::db::open(&p, &crewlet::db::MIGRATOR).await.unwrap() }
    };
    let current = Some(("embed-2".to_string(), 4u32));
    let x = MemoryStore::new(open("x").await).with_current_vector(current.clone());
    let y = MemoryStore::new(open("y").await).with_current_vector(current);
    let log: Arc<dyn Changelog> = match f.kind {
        Kind::Twin => Arc::new(TwinChangelog::new()),
        Kind::Nats => {
            let c = async_nats::connect(f.server.as_ref().unwrap().url())
                .await
                .unwrap();
            Arc::new(
                NatsChangelog::new(c, 1, Duration::from_secs(2))
                    .await
                    .unwrap(),
            )
        }
    };
    (x, y, log, dir)
}

/// A hydration applies its rows a few hundred to a write transaction
/// (`CARRIED_PER_WRITE`), not one each: more rows than two writes hold all
/// arrive, and rows a hostile or broken publisher put on the seat's
/// changelog — one claiming another seat, one with a column of the wrong
/// type — are skipped one by one without losing their neighbours or
/// ending the hydration.
async fn a_hydration_larger_than_one_write_carries_every_row_and_skips_only_the_unreadable(
    f: Fleet,
) {
    let (x, y, log, _dir) = stores(&f).await;
    let n = 2 * changelog_rows_per_write() + 17;
    for i in 0..n {
        x.diary_write("s0", &format!("note {i}"), None)
            .await
            .unwrap();
    }
    assert_eq!(changelog::flush(&x, &*log, "s0").await.unwrap(), n);
    let good = log.replay("s0").await.unwrap();
    let mut other_seat = good[0].clone();
    other_seat.id = "forged-1".into();
    other_seat.row.insert("id".into(), "forged-1".into());
    other_seat.row.insert("agent_handle".into(), "s1".into());
    let mut wrong_type = good[1].clone();
    wrong_type.id = "forged-2".into();
    wrong_type.row.insert("id".into(), "forged-2".into());
    wrong_type
        .row
        .insert("content".into(), serde_json::json!(42));
    for row in [&other_seat, &wrong_type] {
        log.publish("s0", row).await.unwrap();
    }
    let h = changelog::hydrate(&y, &*log, "s0").await.unwrap();
    assert_eq!(h.inserted, n, "{h:?}");
    assert_eq!(h.unreadable, 2, "{h:?}");
    assert_eq!(y.diary("s0", 10_000).await.unwrap().len(), n);
    assert_eq!(
        y.diary("s1", 10).await.unwrap(),
        [],
        "nothing reaches another seat"
    );
    // Replayed again: every row is here already, nothing is lost or doubled.
    let again = changelog::hydrate(&y, &*log, "s0").await.unwrap();
    assert_eq!((again.inserted, again.kept_local), (0, n), "{again:?}");
}

fn changelog_rows_per_write() -> usize {
    crewlet::memory::store::CARRIED_PER_WRITE
}

async fn a_carried_vector_fills_a_stale_one_and_a_stale_copy_never_erases_a_filled_one(f: Fleet) {
    let (x, y, log, _dir) = stores(&f).await;
    // x writes a note with no vector; y hydrates it.
    x.diary_write("s0", "remember this", None).await.unwrap();
    changelog::flush(&x, &*log, "s0").await.unwrap();
    let stale = log.replay("s0").await.unwrap();
    changelog::hydrate(&y, &*log, "s0").await.unwrap();
    let id = y.diary("s0", 1).await.unwrap()[0].id.clone();
    assert_eq!(y.vector_of(Table::AgentDiary, &id).await.unwrap(), None);
    // x fills the vector under the company's model: the changelog carries
    // the row again, and y takes the vector over its empty one.
    assert!(
        x.set_vector(Table::AgentDiary, &id, "embed-2", &[1, 2, 3, 4], 4)
            .await
            .unwrap()
    );
    assert_eq!(changelog::flush(&x, &*log, "s0").await.unwrap(), 1);
    let h = changelog::hydrate(&y, &*log, "s0").await.unwrap();
    assert_eq!(h.vectors_taken, 1);
    assert_eq!(
        y.vector_of(Table::AgentDiary, &id).await.unwrap(),
        Some(("embed-2".into(), 4, vec![1, 2, 3, 4]))
    );
    // The reverse: the stale copy (no vector) replayed later never erases
    // it, and neither does a copy under a model the company has left.
    for row in &stale {
        assert_eq!(
            y.apply_carried("s0", row).await.unwrap(),
            Applied::KeptLocal
        );
    }
    let mut old_model = stale[0].clone();
    old_model
        .row
        .insert("vector".into(), serde_json::json!(hex_of(&[9, 9])));
    old_model
        .row
        .insert("vector_model".into(), serde_json::json!("embed-1"));
    old_model
        .row
        .insert("vector_dims".into(), serde_json::json!(2));
    assert_eq!(
        y.apply_carried("s0", &old_model).await.unwrap(),
        Applied::KeptLocal
    );
    assert_eq!(
        y.vector_of(Table::AgentDiary, &id).await.unwrap(),
        Some(("embed-2".into(), 4, vec![1, 2, 3, 4]))
    );
    // And a stored vector of another model is replaced by the current one.
    assert!(
        y.set_vector(Table::AgentDiary, &id, "embed-1", &[7, 7], 2)
            .await
            .unwrap()
    );
    changelog::hydrate(&y, &*log, "s0").await.unwrap();
    assert_eq!(
        y.vector_of(Table::AgentDiary, &id).await.unwrap(),
        Some(("embed-2".into(), 4, vec![1, 2, 3, 4]))
    );
}

fn hex_of(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

async fn deleting_the_newest_diary_note_and_writing_another_still_carries_the_new_one(f: Fleet) {
    let (x, y, log, _dir) = stores(&f).await;
    x.diary_write("s0", "first", None).await.unwrap();
    x.diary_write("s0", "second", None).await.unwrap();
    changelog::flush(&x, &*log, "s0").await.unwrap();
    // The diary's trim takes the newest note; the next note gets its rowid.
    let newest_rowid: i64 = sqlx::query_scalar("SELECT MAX(rowid) FROM agent_diary")
        .fetch_one(x.pool())
        .await
        .unwrap();
    sqlx::query("DELETE FROM agent_diary WHERE content = 'second'")
        .execute(x.pool())
        .await
        .unwrap();
    x.diary_write("s0", "third", None).await.unwrap();
    let third_rowid: i64 =
        sqlx::query_scalar("SELECT rowid FROM agent_diary WHERE content = 'third'")
            .fetch_one(x.pool())
            .await
            .unwrap();
    assert_eq!(
        third_rowid, newest_rowid,
        "SQLite handed the rowid out again"
    );
    assert_eq!(changelog::flush(&x, &*log, "s0").await.unwrap(), 1);
    changelog::hydrate(&y, &*log, "s0").await.unwrap();
    let notes: Vec<String> = y
        .diary("s0", 10)
        .await
        .unwrap()
        .into_iter()
        .map(|n| n.content)
        .collect();
    assert!(notes.contains(&"third".to_string()), "{notes:?}");
}

async fn a_hydration_that_fails_refuses_the_seat_and_a_peer_takes_it(f: Fleet) {
    let a = f.node("a", &[echo_role("s0")]).await;
    f.until("a holds s0", WAIT, || a.holds("s0")).await;
    a.turns
        .memory()
        .episode_write("s0", Some("work-1"), "did it", "turn-1")
        .await
        .unwrap();
    // b's store cannot take the seat's episodes.
    let mut b = f.node("b", &[]).await;
    sqlx::query("DROP TABLE episodes")
        .execute(b.turns.memory().pool())
        .await
        .unwrap();
    a.engine.drain().await;
    f.until("b refuses s0", WAIT, || {
        !b.matching(|e| match e {
            Event::SeatDetached { seat, reason, .. }
                if seat == "s0" && *reason == DetachReason::HookFailed =>
            {
                Some(())
            }
            _ => None,
        })
        .is_empty()
    })
    .await;
    // b may try again (and fail again); it never attaches the seat.
    assert!(
        b.matching(|e| match e {
            Event::SeatAttached { seat, .. } if seat == "s0" => Some(()),
            _ => None,
        })
        .is_empty(),
        "a seat serving with amnesia is not served"
    );
    let c = f.node("c", &[]).await;
    b.engine.drain().await;
    f.until("c has s0 established", WAIT, || c.attached("s0"))
        .await;
    let episodes = c.turns.memory().episodes("s0", 10).await.unwrap();
    assert_eq!(episodes.len(), 1);
    assert_eq!(episodes[0].work_key.as_deref(), Some("work-1"));
}

async fn one_store() -> (MemoryStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let pool = crewlet::db::open(dir.path(), &crewlet::db::MIGRATOR)
        .await
        .unwrap();
    (MemoryStore::new(pool), dir)
}

#[tokio::test]
async fn a_cycle_reads_only_the_seats_with_rows_past_what_was_published_of_them() {
    let (m, _dir) = one_store().await;
    let (peer, _peer_dir) = one_store().await;
    let set = |v: &[&str]| {
        v.iter()
            .map(|s| s.to_string())
            .collect::<std::collections::BTreeSet<_>>()
    };
    assert_eq!(m.seats_with_unpublished().await.unwrap(), set(&[]));
    remember_everything(&m, "s0", "1").await;
    m.diary_write("s1", "only a note", None).await.unwrap();
    assert_eq!(
        m.seats_with_unpublished().await.unwrap(),
        set(&["s0", "s1"])
    );

    let log = TwinChangelog::new();
    assert_eq!(changelog::flush(&m, &log, "s0").await.unwrap(), 7);
    assert_eq!(
        m.seats_with_unpublished().await.unwrap(),
        set(&["s1"]),
        "a flushed seat has nothing new"
    );
    // Rows carried in by a hydration are on the changelog already.
    peer.diary_write("s2", "carried", None).await.unwrap();
    for row in peer.rows_since("s2", 0).await.unwrap() {
        m.apply_carried("s2", &row).await.unwrap();
    }
    assert_eq!(m.seats_with_unpublished().await.unwrap(), set(&["s1"]));
    // A new row on any table of a flushed seat brings it back.
    m.marker_set("s0", "fresh-marker", "done").await.unwrap();
    assert_eq!(
        m.seats_with_unpublished().await.unwrap(),
        set(&["s0", "s1"])
    );
}

#[tokio::test]
async fn an_interaction_is_counted_once_per_unit_of_work() {
    let (m, _dir) = one_store().await;
    assert_eq!(
        m.counterparty_seen("s0", "alice", Some("w1"))
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        m.counterparty_seen("s0", "alice", Some("w1"))
            .await
            .unwrap(),
        1,
        "the same work again is not counted"
    );
    assert_eq!(
        m.counterparty_seen("s0", "alice", Some("w2"))
            .await
            .unwrap(),
        2
    );
    // Unkeyed interactions always count.
    assert_eq!(m.counterparty_seen("s0", "alice", None).await.unwrap(), 3);
    assert_eq!(m.counterparty_seen("s0", "alice", None).await.unwrap(), 4);
}

#[tokio::test]
async fn an_episode_is_one_per_unit_of_work_and_an_unkeyed_one_is_never_deduplicated() {
    let (m, _dir) = one_store().await;
    assert!(m.episode_write("s0", Some("k"), "a", "t1").await.unwrap());
    assert!(!m.episode_write("s0", Some("k"), "b", "t2").await.unwrap());
    assert!(
        m.episode_write("s1", Some("k"), "c", "t3").await.unwrap(),
        "another seat's episode of the same work is its own"
    );
    assert!(m.episode_write("s0", None, "d", "t4").await.unwrap());
    assert!(m.episode_write("s0", Some(""), "e", "t5").await.unwrap());
    assert_eq!(m.episodes("s0", 10).await.unwrap().len(), 3);
}

#[tokio::test]
async fn retention_sweeps_expired_notes_and_notes_over_the_cap() {
    let (m, _dir) = one_store().await;
    let m = m.with_diary_days(1);
    for i in 0..5 {
        m.diary_write("s0", &format!("note {i}"), None)
            .await
            .unwrap();
    }
    m.diary_write("s1", "other seat", None).await.unwrap();
    // Nothing has expired yet; the cap keeps each seat's newest three.
    assert_eq!(
        m.sweep_diary("2026-01-01T00:00:00Z", 3).await.unwrap(),
        (0, 2)
    );
    let left: Vec<String> = m
        .diary("s0", 10)
        .await
        .unwrap()
        .into_iter()
        .map(|n| n.content)
        .collect();
    assert_eq!(left, ["note 4", "note 3", "note 2"]);
    // Far in the future, everything has expired.
    assert_eq!(
        m.sweep_diary("9999-01-01T00:00:00Z", 0).await.unwrap(),
        (4, 0)
    );
}

async fn a_cycle_publishes_only_what_is_new_and_an_idle_cycle_publishes_nothing(f: Fleet) {
    let a = f.node("a", &[echo_role("s0")]).await;
    f.until("a holds s0", WAIT, || a.attached("s0")).await;
    let held = ["s0".to_string()];
    remember_everything(a.turns.memory(), "s0", "1").await;
    assert_eq!(a.turns.flush_memory(&held).await, 7);
    assert_eq!(a.turns.flush_memory(&held).await, 0, "an idle cycle");
    a.turns
        .memory()
        .diary_write("s0", "one more", None)
        .await
        .unwrap();
    assert_eq!(a.turns.flush_memory(&held).await, 1);
    assert_eq!(a.changelog.replay("s0").await.unwrap().len(), 8);
}

/// A cycle flushes its seats side by side, a few at a time: every seat
/// with something new — more seats than flush at once — is published in
/// that one cycle, each seat's rows under its own changelog, and the next
/// cycle has nothing left.
async fn one_cycle_publishes_every_seat_with_new_memory_however_many(f: Fleet) {
    let a = f.node("a", &[echo_role("s0")]).await;
    f.until("a holds s0", WAIT, || a.attached("s0")).await;
    let held: Vec<String> = (0..20).map(|i| format!("s{i}")).collect();
    for h in &held {
        remember_everything(a.turns.memory(), h, "1").await;
    }
    assert_eq!(a.turns.flush_memory(&held).await, 7 * held.len());
    assert_eq!(a.turns.flush_memory(&held).await, 0, "an idle cycle");
    for h in &held {
        assert_eq!(a.changelog.replay(h).await.unwrap().len(), 7, "{h}");
    }
}

/// How many of `seat`'s diary notes on node `n` read exactly `note`.
async fn notes_reading(n: &Node, seat: &str, note: &str) -> usize {
    n.turns
        .memory()
        .diary(seat, 1000)
        .await
        .unwrap()
        .iter()
        .filter(|d| d.content == note)
        .count()
}

/// Spec § A seat's memory follows it: the node that ran a turn puts a
/// `reflection_due` wake on `crewlet.agent.{handle}.reflect`, and the
/// seat's holder runs the agent's reflection (for `echo`, a diary note
/// summarising the turn) into its own store — once, even when the wake
/// comes again (a byte-identical note collapses on write).
async fn a_finished_turn_is_reflected_on_by_the_seats_holder_and_written_once(f: Fleet) {
    let roles = [pinned("s0", "a"), pinned("s1", "b")];
    let mut a = f.node("a", &roles).await;
    let b = f.node("b", &roles).await;
    f.until("a has s0 established", WAIT, || a.attached("s0"))
        .await;
    f.until("b has s1 established", WAIT, || b.attached("s1"))
        .await;
    a.publish("s0", &trigger("E1", serde_json::json!({}))).await;
    f.until("the turn completes", WAIT, || !a.turns_of("E1").is_empty())
        .await;
    let done = a.matching(|e| match e {
        Event::TurnCompleted {
            seat,
            turn_id,
            work_key,
            outcome,
            ..
        } if seat == "s0" && outcome == "completed" => Some((turn_id.clone(), work_key.clone())),
        _ => None,
    });
    assert_eq!(done.len(), 1, "{done:?}");
    let (turn_id, work_key) = done[0].clone();
    let note = format!("reflection on turn {turn_id}: answered E1");
    f.until_async("the holder writes the reflection", WAIT, || async {
        notes_reading(&a, "s0", &note).await == 1
    })
    .await;
    f.until_async("the reflect subject is drained", WAIT, || async {
        a.queue.pending(&reflect_group("s0")).await.unwrap() == 0
    })
    .await;
    let written: Vec<_> = a
        .turns
        .memory()
        .diary("s0", 1000)
        .await
        .unwrap()
        .into_iter()
        .filter(|d| d.content == note)
        .collect();
    assert_eq!(written.len(), 1, "written once");
    assert_eq!(
        written[0].work_key, work_key,
        "the note is keyed on the turn's work"
    );
    // The same wake again (a redelivery): the note is not written twice.
    let wake = serde_json::json!({
        "type": "reflection_due",
        "turn_id": turn_id,
        "work_key": work_key,
        "trigger_ids": ["E1"],
    });
    b.queue
        .publish(
            &reflect_subject("s0"),
            None,
            bytes::Bytes::from(wake.to_string()),
        )
        .await
        .unwrap();
    f.until_async("the copy is consumed", WAIT, || async {
        a.queue.pending(&reflect_group("s0")).await.unwrap() == 0
    })
    .await;
    assert_eq!(notes_reading(&a, "s0", &note).await, 1, "still once");
    // Only the holder reflected: b, which holds another seat, has no
    // memory of s0.
    assert!(b.turns.memory().diary("s0", 10).await.unwrap().is_empty());
    assert!(
        a.queue.dead_letters(10).await.unwrap().is_empty(),
        "no wake was dead-lettered"
    );
}

/// Spec § A seat's memory follows it: a wake published while the seat is
/// between holders waits on the subject, and the next holder (after
/// hydrating the seat) writes the reflection into its own store.
async fn a_reflection_wake_published_between_holders_is_written_by_the_next_holder(f: Fleet) {
    let a = f.node("a", &[echo_role("s0")]).await;
    f.until("a has s0 established", WAIT, || a.attached("s0"))
        .await;
    // a dies holding the seat: nobody consumes its reflect subject now.
    a.engine.crash().await;
    let (_, queue, _, _) = f.backends("x").await;
    let wake = serde_json::json!({
        "type": "reflection_due",
        "turn_id": "t-between",
        "work_key": "work-between",
        "trigger_ids": ["W1"],
    });
    queue
        .publish(
            &reflect_subject("s0"),
            Some("reflect-t-between"),
            bytes::Bytes::from(wake.to_string()),
        )
        .await
        .unwrap();
    assert_eq!(
        queue.pending(&reflect_group("s0")).await.unwrap(),
        1,
        "the wake waits on the subject"
    );
    let b = f.node("b", &[]).await;
    f.until("b has s0 established", WAIT, || b.attached("s0"))
        .await;
    let note = "reflection on turn t-between: answered W1";
    f.until_async("b writes the reflection", WAIT, || async {
        notes_reading(&b, "s0", note).await == 1
    })
    .await;
    f.until_async("the reflect subject is drained", WAIT, || async {
        b.queue.pending(&reflect_group("s0")).await.unwrap() == 0
    })
    .await;
    let written = b.turns.memory().diary("s0", 10).await.unwrap();
    let ours: Vec<_> = written.iter().filter(|d| d.content == note).collect();
    assert_eq!(ours.len(), 1, "{written:?}");
    assert_eq!(ours[0].work_key.as_deref(), Some("work-between"));
    assert_eq!(
        notes_reading(&a, "s0", note).await,
        0,
        "the dead holder wrote nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_racing_a_turns_writes_never_skips_a_row() {
    // The chaos soak (seed 1015) handed a seat over with one episode not
    // carried: a flush read the episodes before a turn's episode committed
    // and a later table after that turn's next row did, and marked past
    // both. Each flush must read every table from one snapshot.
    let (m, _dir) = one_store().await;
    let m = Arc::new(m);
    let log = Arc::new(TwinChangelog::new());
    let writing = tokio::spawn({
        let m = m.clone();
        async move {
            for i in 0..400 {
                let work = format!("w{i}");
                m.diary_write("s0", &format!("note {i}"), None)
                    .await
                    .unwrap();
                m.episode_write("s0", Some(&work), "a turn", &format!("t{i}"))
                    .await
                    .unwrap();
                m.conversation_add("s0", "thread", None, "alice", &format!("m{i}"))
                    .await
                    .unwrap();
            }
        }
    });
    while !writing.is_finished() {
        changelog::flush(&m, &*log, "s0").await.unwrap();
    }
    writing.await.unwrap();
    changelog::flush(&m, &*log, "s0").await.unwrap();
    let carried: std::collections::BTreeSet<(String, String)> = log
        .replay("s0")
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.table.name().to_string(), r.id))
        .collect();
    let written: std::collections::BTreeSet<(String, String)> = m
        .rows_since("s0", 0)
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.table.name().to_string(), r.id))
        .collect();
    assert_eq!(written.len(), 1200);
    let missing: Vec<_> = written.difference(&carried).collect();
    assert!(missing.is_empty(), "rows never carried: {missing:?}");
}
