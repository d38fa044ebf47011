//! Singleton duties, the removed seat's mailbox and the scheduler, on the
//! in-process twin and on a real nats-server, with the grace shortened
//! (spec § Singleton duties, § The removed seat).

use crate::support;
use crate::support::duty_faults;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use crewlet::config::ScheduleConfig;
use crewlet::coord::StateBucket;
use crewlet::duty::mailboxes::{MailboxRecord, MailboxSweep, RetirementMark};
use crewlet::duty::scheduler::Scheduler;
use crewlet::duty::{Duties, Duty, DutyContext};
use crewlet::events::{Event, EventBus};
use crewlet::node::company;
use crewlet::queue::{QueueSettings, ensure_seat_mailboxes, inbox_group, inbox_subject};
use crewlet::tasks::Tasks;
use support::turnfleet::*;

const WAIT: Duration = Duration::from_secs(20);
const GRACE: Duration = Duration::from_secs(2);

both!(
    a_removed_seats_mailbox_is_retired_after_the_grace_not_before_and_its_memory_is_kept,
    a_seat_restored_within_the_grace_comes_back_to_its_mail,
    two_nodes_sweeping_at_once_retire_exactly_once,
    a_seat_added_back_during_a_retirement_starts_with_an_empty_inbox,
    a_mailbox_whose_registration_failed_is_discovered_from_the_broker_listing,
    a_duty_moves_to_a_peer_when_its_holder_dies,
    a_graceful_stop_gives_a_duty_back_at_once,
    a_schedule_fires_once_per_due_time_on_a_three_node_fleet,
    unknown_is_never_absent_an_unreadable_pointer_registry_or_lease_stamps_and_retires_nothing,
    a_retirement_the_protocol_gate_refuses_waits_and_says_it_was_the_protocol,
    a_registration_that_fails_is_reported_the_mailbox_is_created_anyway_and_a_later_sweep_finds_it,
    a_consumer_under_another_group_on_a_seats_subject_is_left_alone_by_the_sweep,
    a_duty_claim_or_renewal_that_errors_skips_the_tick,
    a_retirement_whose_runs_cannot_be_ended_within_half_the_ttl_deletes_nothing_and_waits_for_the_next_tick,
    a_mark_left_by_a_sweep_that_died_is_left_alone_then_resumed_once_fifteen_minutes_old,
    a_seat_added_back_while_the_real_sweep_retires_it_waits_and_starts_with_an_empty_inbox,
    a_registry_that_cannot_be_listed_at_boot_leaves_every_seat_unregistered_with_its_mailbox_created,
);

fn sweep(n: &Node) -> MailboxSweep {
    MailboxSweep {
        store: n.store.clone(),
        queue: n.queue.clone(),
        events: n.engine.events().clone(),
        company: n.engine.company_watch(),
        node_id: n.engine.config().node_id.clone(),
        protocol: 4,
        grace: GRACE,
        queue_settings: QueueSettings::default(),
    }
}

async fn pending(n: &Node, handle: &str) -> Option<u64> {
    n.queue.pending(&inbox_group(handle)).await.ok()
}

/// Remove `s1` from a company of `s0` and `s1`, wait until `n` applied it
/// and gave the seat back, and leave one message in its inbox.
async fn remove_s1_with_mail(f: &Fleet, n: &Node) {
    company::apply(&*n.store, COMPANY, &[echo_role("s0")])
        .await
        .unwrap();
    let watch = n.engine.company_watch();
    f.until("the removal is applied and s1 given back", WAIT, || {
        watch.borrow().roles.len() == 1 && !n.holds("s1")
    })
    .await;
    n.queue
        .publish(
            &inbox_subject("s1"),
            None,
            Bytes::from(trigger("late-mail", serde_json::json!({})).encode()),
        )
        .await
        .unwrap();
    assert_eq!(pending(n, "s1").await, Some(1));
}

/// `handle`'s mailbox record (it must be there).
async fn record(n: &Node, handle: &str) -> MailboxRecord {
    let e = n
        .store
        .get(StateBucket::Mailboxes, handle)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{handle} has no mailbox record"));
    serde_json::from_slice(&e.value).unwrap()
}

/// Wait until the grace has run out, on the store's clock, since `handle`
/// was stamped absent.
async fn until_the_grace_has_passed(f: &Fleet, n: &Node, handle: &str) {
    let since = record(n, handle)
        .await
        .absent_since_ms
        .expect("stamped absent");
    f.until_async("the grace has passed", WAIT, || async {
        let now = n.store.now().await.unwrap().unix_nanos() / 1_000_000;
        now - since >= GRACE.as_millis() as i64
    })
    .await;
}

/// Unknown is never absent (spec § The removed seat): a tick that cannot
/// read the activation pointer, the mailbox registry or a seat's lease
/// stamps nothing and retires nothing, and says why. One table over the
/// three reads; the same tick, healthy, then does both — so each fault was
/// the only thing in the way.
async fn unknown_is_never_absent_an_unreadable_pointer_registry_or_lease_stamps_and_retires_nothing(
    f: Fleet,
) {
    use duty_faults::{Fault, FaultyStore};
    let mut a = f
        .node("a", &[echo_role("s0"), echo_role("s1"), echo_role("s2")])
        .await;
    f.until("a holds all three", WAIT, || {
        a.holds("s0") && a.holds("s1") && a.holds("s2")
    })
    .await;
    // s1 is removed, stamped absent and past its grace: due to retire.
    company::apply(&*a.store, COMPANY, &[echo_role("s0"), echo_role("s2")])
        .await
        .unwrap();
    let watch = a.engine.company_watch();
    f.until("s1's removal is applied and s1 given back", WAIT, || {
        watch.borrow().roles.len() == 2 && !a.holds("s1")
    })
    .await;
    f.until_async("s1's lease is gone", WAIT, || async {
        a.store.lease("seat:s1").await.unwrap().is_none()
    })
    .await;
    a.publish("s1", &trigger("late-mail", serde_json::json!({})))
        .await;
    assert_eq!(sweep(&a).tick().await.absent, vec!["s1"]);
    let stamped = record(&a, "s1").await;
    until_the_grace_has_passed(&f, &a, "s1").await;
    // s2 is removed since: due to be stamped.
    company::apply(&*a.store, COMPANY, &[echo_role("s0")])
        .await
        .unwrap();
    f.until("s2's removal is applied and s2 given back", WAIT, || {
        watch.borrow().roles.len() == 1 && !a.holds("s2")
    })
    .await;
    f.until_async("s2's lease is gone", WAIT, || async {
        a.store.lease("seat:s2").await.unwrap().is_none()
    })
    .await;
    let absent_before = a
        .matching(|e| match e {
            Event::SeatMailboxAbsent { seat, .. } => Some(seat.clone()),
            _ => None,
        })
        .len();

    let table = [
        (
            "the activation pointer",
            Fault::Get(StateBucket::Config, company::ACTIVE_KEY.to_string()),
        ),
        (
            "the mailbox registry",
            Fault::Entries(StateBucket::Mailboxes),
        ),
        ("the lease of seat s1", Fault::Lease("seat:s1".to_string())),
    ];
    for (what, fault) in table {
        let faulty = FaultyStore::new(a.store.clone(), std::slice::from_ref(&fault));
        let s = MailboxSweep {
            store: faulty.clone(),
            ..sweep(&a)
        };
        let r = s.tick().await;
        assert!(
            faulty.hits(&fault) >= 1,
            "{what}: the fault was never reached"
        );
        assert!(
            r.absent.is_empty() && r.retired.is_empty() && r.discovered.is_empty(),
            "{what}: {r:?}"
        );
        assert!(
            r.unknown
                .as_deref()
                .is_some_and(|u| u.contains("cannot be read")),
            "{what}: the tick says why: {r:?}"
        );
        assert_eq!(record(&a, "s1").await, stamped, "{what}: s1 untouched");
        assert_eq!(record(&a, "s2").await.absent_since_ms, None, "{what}");
        assert_eq!(pending(&a, "s1").await, Some(1), "{what}: the mail is kept");
        assert!(
            a.store.lease("seat:s1").await.unwrap().is_none(),
            "{what}: the seat was never claimed"
        );
    }
    let absent_after = a
        .matching(|e| match e {
            Event::SeatMailboxAbsent { seat, .. } => Some(seat.clone()),
            _ => None,
        })
        .len();
    assert_eq!(absent_after, absent_before, "no absence was announced");
    assert!(
        a.matching(|e| match e {
            Event::SeatMailboxRetired { seat } => Some(seat.clone()),
            _ => None,
        })
        .is_empty()
    );
    // Healthy again, the same judgement goes through.
    let r = sweep(&a).tick().await;
    assert_eq!(r.retired, vec!["s1"], "{r:?}");
    assert_eq!(r.absent, vec!["s2"], "{r:?}");
}

/// The protocol gate (spec § The removed seat, § Mixed-version fleets): while
/// a node on a lower lease protocol still holds a presence or a seat lease
/// anywhere in the fleet, the retirement claims nothing, keeps the mailbox
/// and its mail, and says the refusal was the protocol's (not a holder's).
/// The gate only looks down: a higher-protocol lease does not stop it.
async fn a_retirement_the_protocol_gate_refuses_waits_and_says_it_was_the_protocol(f: Fleet) {
    use crewlet::coord::{Claim, ClaimRequest, Release};
    let mut a = f.node("a", &[echo_role("s0"), echo_role("s1")]).await;
    f.until("a holds both", WAIT, || a.holds("s0") && a.holds("s1"))
        .await;
    remove_s1_with_mail(&f, &a).await;
    f.until_async("s1's lease is gone", WAIT, || async {
        a.store.lease("seat:s1").await.unwrap().is_none()
    })
    .await;
    assert_eq!(sweep(&a).tick().await.absent, vec!["s1"]);
    let stamped = record(&a, "s1").await;
    until_the_grace_has_passed(&f, &a, "s1").await;
    for (what, resource) in [
        ("an older node's presence", "node:old"),
        ("an older node's seat", "seat:elsewhere"),
    ] {
        let req = ClaimRequest::new(resource, "old:1", "old").with_protocol(3);
        let Claim::Won(old) = a.store.claim(req).await.unwrap() else {
            panic!("{what}: the lower-protocol lease is taken");
        };
        let r = sweep(&a).tick().await;
        assert_eq!(r.held, vec!["s1"], "{what}: {r:?}");
        assert!(r.retired.is_empty(), "{what}: {r:?}");
        assert_eq!(pending(&a, "s1").await, Some(1), "{what}: the mail is kept");
        assert_eq!(record(&a, "s1").await, stamped, "{what}: nothing marked");
        assert!(
            a.store.lease("seat:s1").await.unwrap().is_none(),
            "{what}: the seat was not claimed"
        );
        assert_eq!(
            a.store.release(&old, "old:1").await.unwrap(),
            Release::Released
        );
    }
    let held = a.matching(|e| match e {
        Event::SeatMailboxRetirementHeld {
            seat,
            refused,
            holder,
        } => Some((seat.clone(), refused.clone(), holder.clone())),
        _ => None,
    });
    assert_eq!(
        held,
        vec![
            ("s1".to_string(), "protocol".to_string(), None),
            ("s1".to_string(), "protocol".to_string(), None),
        ],
        "the refusal names the protocol, never a holder"
    );
    // A newer node's lease is no reason to wait.
    let req = ClaimRequest::new("node:newer", "newer:1", "newer").with_protocol(5);
    assert!(matches!(a.store.claim(req).await.unwrap(), Claim::Won(_)));
    let r = sweep(&a).tick().await;
    assert_eq!(r.retired, vec!["s1"], "{r:?}");
    assert_eq!(pending(&a, "s1").await, None, "the mailbox is gone");
}

/// The names of the broker's subscriptions.
async fn subscription_names(n: &Node) -> Vec<String> {
    n.queue
        .list_subscriptions()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect()
}

/// A registration that fails (spec § The removed seat): the node says so
/// (`seat_mailbox_unregistered`, with the error) and creates the seat's
/// mailbox anyway, and the seat works its mail — a seat in the company
/// losing mail is worse than a mailbox with no record. The next sweep finds
/// both such seats: the one still in the company is registered; the one
/// removed since is discovered from the broker's listing and stamped absent
/// on that tick.
async fn a_registration_that_fails_is_reported_the_mailbox_is_created_anyway_and_a_later_sweep_finds_it(
    f: Fleet,
) {
    use duty_faults::{Fault, node_over_faults};
    let faults = [
        Fault::Create(StateBucket::Mailboxes, "s1".into()),
        Fault::Create(StateBucket::Mailboxes, "s2".into()),
    ];
    let roles = [echo_role("s0"), echo_role("s1"), echo_role("s2")];
    let (mut a, faulty) = node_over_faults(&f, "a", &roles, &faults).await;
    for fault in &faults {
        assert!(faulty.hits(fault) >= 1, "{fault:?} was never reached");
    }
    let mut unregistered = a.matching(|e| match e {
        Event::SeatMailboxUnregistered { seat, error } => Some((seat.clone(), error.clone())),
        _ => None,
    });
    unregistered.sort();
    assert_eq!(
        unregistered
            .iter()
            .map(|(s, _)| s.as_str())
            .collect::<Vec<_>>(),
        vec!["s1", "s2"],
        "{unregistered:?}"
    );
    assert!(
        unregistered.iter().all(|(_, e)| e.contains("injected")),
        "each names its error: {unregistered:?}"
    );
    for h in ["s1", "s2"] {
        assert!(
            a.store
                .get(StateBucket::Mailboxes, h)
                .await
                .unwrap()
                .is_none()
        );
    }
    let names = subscription_names(&a).await;
    for g in ["agent-s1", "control-s1", "reflect-s1", "agent-s2"] {
        assert!(names.contains(&g.to_string()), "{g} missing: {names:?}");
    }
    f.until("a holds all three", WAIT, || {
        a.holds("s0") && a.holds("s1") && a.holds("s2")
    })
    .await;
    a.publish("s1", &trigger("s1-mail", serde_json::json!({})))
        .await;
    f.until("the unregistered seat works its mail", WAIT, || {
        !a.turns_of("s1-mail").is_empty()
    })
    .await;
    // s1 is removed before any sweep ran (the apply's own registration
    // of s2 failing again), and then the store answers again.
    company::apply(&*a.store, COMPANY, &[echo_role("s0"), echo_role("s2")])
        .await
        .unwrap();
    f.until("the removal is applied", WAIT, || {
        a.matching(|e| match e {
            Event::CompanyApplied { seats: 2, .. } => Some(()),
            _ => None,
        })
        .len()
            == 1
    })
    .await;
    faulty.heal();
    let r = sweep(&a).tick().await;
    assert_eq!(r.discovered, vec!["s1"], "{r:?}");
    assert_eq!(r.registered, vec!["s2"], "{r:?}");
    assert!(
        record(&a, "s1").await.absent_since_ms.is_some(),
        "stamped absent on the tick that found it"
    );
    assert_eq!(record(&a, "s2").await.absent_since_ms, None);
    assert_eq!(
        a.matching(|e| match e {
            Event::SeatMailboxDiscovered { seat } => Some(seat.clone()),
            _ => None,
        }),
        vec!["s1"]
    );
}

/// The registration's first read is the registry's listing; when that
/// fails every seat is reported unregistered (`seat_mailbox_unregistered`)
/// and every seat's mailbox is created all the same, so no seat in the
/// company loses mail; the next sweep registers them.
async fn a_registry_that_cannot_be_listed_at_boot_leaves_every_seat_unregistered_with_its_mailbox_created(
    f: Fleet,
) {
    use duty_faults::{Fault, node_over_faults};
    let listing = Fault::Entries(StateBucket::Mailboxes);
    let (mut a, faulty) = node_over_faults(
        &f,
        "a",
        &[echo_role("s0"), echo_role("s1")],
        std::slice::from_ref(&listing),
    )
    .await;
    assert!(faulty.hits(&listing) >= 1);
    let mut unregistered = a.matching(|e| match e {
        Event::SeatMailboxUnregistered { seat, .. } => Some(seat.clone()),
        _ => None,
    });
    unregistered.sort();
    assert_eq!(unregistered, vec!["s0", "s1"]);
    let names = subscription_names(&a).await;
    for g in [
        "agent-s0",
        "control-s0",
        "reflect-s0",
        "agent-s1",
        "control-s1",
        "reflect-s1",
    ] {
        assert!(names.contains(&g.to_string()), "{g} missing: {names:?}");
    }
    f.until("a holds both", WAIT, || a.holds("s0") && a.holds("s1"))
        .await;
    faulty.heal();
    let mut r = sweep(&a).tick().await;
    r.registered.sort();
    assert_eq!(r.registered, vec!["s0", "s1"], "{r:?}");
    assert_eq!(record(&a, "s1").await.absent_since_ms, None);
}

/// Only a subscription the mailbox grammar produces counts (spec § The
/// removed seat): a consumer on a seat's inbox under any other group is
/// somebody else's. The sweep neither discovers one on an unknown handle
/// nor deletes one on a retired seat's subject, and the mail it holds stays.
async fn a_consumer_under_another_group_on_a_seats_subject_is_left_alone_by_the_sweep(f: Fleet) {
    use crewlet::queue::SubscriptionSpec;
    let a = f.node("a", &[echo_role("s0"), echo_role("s1")]).await;
    f.until("a holds both", WAIT, || a.holds("s0") && a.holds("s1"))
        .await;
    for (name, handle) in [("tap-s1", "s1"), ("tap-nobody", "nobody")] {
        a.queue
            .ensure_subscription(&SubscriptionSpec::new(
                name.into(),
                inbox_subject(handle),
                QueueSettings::default(),
            ))
            .await
            .unwrap();
    }
    remove_s1_with_mail(&f, &a).await;
    assert_eq!(a.queue.pending("tap-s1").await.unwrap(), 1);
    f.until_async("s1's lease is gone", WAIT, || async {
        a.store.lease("seat:s1").await.unwrap().is_none()
    })
    .await;
    let s = sweep(&a);
    let first = s.tick().await;
    assert_eq!(first.absent, vec!["s1"], "{first:?}");
    assert!(first.discovered.is_empty(), "{first:?}");
    until_the_grace_has_passed(&f, &a, "s1").await;
    let r = s.tick().await;
    assert_eq!(r.retired, vec!["s1"], "{r:?}");
    assert!(r.discovered.is_empty(), "{r:?}");
    let names = subscription_names(&a).await;
    for g in ["agent-s1", "control-s1", "reflect-s1"] {
        assert!(!names.contains(&g.to_string()), "{g} survived: {names:?}");
    }
    for g in ["tap-s1", "tap-nobody"] {
        assert!(names.contains(&g.to_string()), "{g} was deleted: {names:?}");
    }
    assert_eq!(
        a.queue.pending("tap-s1").await.unwrap(),
        1,
        "its mail is kept"
    );
    assert!(
        a.store
            .get(StateBucket::Mailboxes, "nobody")
            .await
            .unwrap()
            .is_none(),
        "never registered"
    );
}

/// A retirement acts for at most half the lease TTL under the seat lease
/// it claimed, ending the seat's runs included (spec § The removed seat). A
/// run-ending that does not finish in time — here the run store never
/// answers — deletes no subscription, unmarks the record, gives the seat's
/// lease back, and leaves the retirement to the next tick, which finishes it.
async fn a_retirement_whose_runs_cannot_be_ended_within_half_the_ttl_deletes_nothing_and_waits_for_the_next_tick(
    f: Fleet,
) {
    use duty_faults::{Fault, FaultyStore};
    let a = f.node("a", &[echo_role("s0"), echo_role("s1")]).await;
    f.until("a holds both", WAIT, || a.holds("s0") && a.holds("s1"))
        .await;
    remove_s1_with_mail(&f, &a).await;
    f.until_async("s1's lease is gone", WAIT, || async {
        a.store.lease("seat:s1").await.unwrap().is_none()
    })
    .await;
    assert_eq!(sweep(&a).tick().await.absent, vec!["s1"]);
    let stamped = record(&a, "s1").await;
    until_the_grace_has_passed(&f, &a, "s1").await;
    let hang = Fault::HangEntries(StateBucket::Runs);
    let faulty = FaultyStore::new(a.store.clone(), std::slice::from_ref(&hang));
    let s = MailboxSweep {
        store: faulty.clone(),
        ..sweep(&a)
    };
    // The tick itself comes back: the budget bounds it, not the run store.
    let r = tokio::time::timeout(WAIT, s.tick())
        .await
        .expect("the retirement was not bounded");
    assert!(faulty.hits(&hang) >= 1, "the runs were never asked for");
    assert!(r.retired.is_empty(), "{r:?}");
    assert_eq!(pending(&a, "s1").await, Some(1), "the mailbox and its mail");
    let names = subscription_names(&a).await;
    for g in ["agent-s1", "control-s1", "reflect-s1"] {
        assert!(names.contains(&g.to_string()), "{g} deleted: {names:?}");
    }
    assert_eq!(
        record(&a, "s1").await,
        stamped,
        "unmarked, still absent since the same tick"
    );
    assert!(
        a.store.lease("seat:s1").await.unwrap().is_none(),
        "the retirement's claim is given back"
    );
    faulty.heal();
    assert_eq!(
        s.tick().await.retired,
        vec!["s1"],
        "the next tick retires it"
    );
    assert_eq!(pending(&a, "s1").await, None);
}

/// Put a retirement mark on `handle`'s record, `age` old on the store's
/// clock, as a sweep that died after marking leaves it.
async fn mark_as_if_a_dead_sweep(n: &Node, handle: &str, age: Duration) {
    let e = n
        .store
        .get(StateBucket::Mailboxes, handle)
        .await
        .unwrap()
        .unwrap();
    let mut rec: MailboxRecord = serde_json::from_slice(&e.value).unwrap();
    let now = n.store.now().await.unwrap().unix_nanos() / 1_000_000;
    rec.retiring = Some(RetirementMark {
        by: "dead:maintenance:1".into(),
        at_ms: now - age.as_millis() as i64,
    });
    n.store
        .update(
            StateBucket::Mailboxes,
            handle,
            Bytes::from(serde_json::to_vec(&rec).unwrap()),
            e.revision,
        )
        .await
        .unwrap();
}

/// A sweep that dies after marking leaves a mark a later sweep resumes
/// once it is 15 minutes old (spec § The removed seat), through the real
/// sweep: a younger mark is a retirement that may still be running and is
/// left alone; an older one is resumed (`seat_mailbox_retirement_resumed`)
/// and the mailbox retired.
async fn a_mark_left_by_a_sweep_that_died_is_left_alone_then_resumed_once_fifteen_minutes_old(
    f: Fleet,
) {
    use crewlet::duty::mailboxes::RESUME_AFTER;
    let mut a = f.node("a", &[echo_role("s0"), echo_role("s1")]).await;
    f.until("a holds both", WAIT, || a.holds("s0") && a.holds("s1"))
        .await;
    remove_s1_with_mail(&f, &a).await;
    f.until_async("s1's lease is gone", WAIT, || async {
        a.store.lease("seat:s1").await.unwrap().is_none()
    })
    .await;
    let s = sweep(&a);
    assert_eq!(s.tick().await.absent, vec!["s1"]);
    until_the_grace_has_passed(&f, &a, "s1").await;
    // A mark one minute short of the resume: a retirement still running.
    mark_as_if_a_dead_sweep(&a, "s1", RESUME_AFTER - Duration::from_secs(60)).await;
    let young = record(&a, "s1").await;
    let r = s.tick().await;
    assert!(r.retired.is_empty() && r.held.is_empty(), "{r:?}");
    assert_eq!(record(&a, "s1").await, young, "left alone");
    assert_eq!(pending(&a, "s1").await, Some(1), "the mail is kept");
    let resumed = |a: &mut Node| {
        a.matching(|e| match e {
            Event::SeatMailboxRetirementResumed { seat } => Some(seat.clone()),
            _ => None,
        })
    };
    assert!(resumed(&mut a).is_empty());
    // The same mark, past 15 minutes: resumed and finished.
    mark_as_if_a_dead_sweep(&a, "s1", RESUME_AFTER + Duration::from_secs(1)).await;
    let r = s.tick().await;
    assert_eq!(r.retired, vec!["s1"], "{r:?}");
    assert_eq!(resumed(&mut a), vec!["s1"]);
    assert_eq!(pending(&a, "s1").await, None, "the mailbox is gone");
    assert!(
        a.store
            .get(StateBucket::Mailboxes, "s1")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        a.store.lease("seat:s1").await.unwrap().is_none(),
        "the resumed retirement's claim is released"
    );
}

/// A node adding a seat back while the sweep is retiring its mailbox
/// (spec § The removed seat), driven by the real sweep: the retirement is
/// held in the middle of its deletes while the revision adding the seat
/// back is applied; the node finds the mark and waits for the retirement,
/// which finishes; the node then registers the seat afresh and its new
/// inbox starts empty — the old backlog gone, the new mail worked, nothing
/// taken over.
async fn a_seat_added_back_while_the_real_sweep_retires_it_waits_and_starts_with_an_empty_inbox(
    f: Fleet,
) {
    use duty_faults::{PausingQueue, node_over_faults};
    let (mut a, store) = node_over_faults(&f, "a", &[echo_role("s0"), echo_role("s1")], &[]).await;
    f.until("a holds both", WAIT, || a.holds("s0") && a.holds("s1"))
        .await;
    remove_s1_with_mail(&f, &a).await;
    f.until_async("s1's lease is gone", WAIT, || async {
        a.store.lease("seat:s1").await.unwrap().is_none()
    })
    .await;
    assert_eq!(sweep(&a).tick().await.absent, vec!["s1"]);
    until_the_grace_has_passed(&f, &a, "s1").await;
    let pausing = PausingQueue::new(a.queue.clone(), "agent-s1");
    let s = MailboxSweep {
        queue: pausing.clone(),
        ..sweep(&a)
    };
    let retiring = tokio::spawn(async move { s.tick().await });
    f.until("the retirement is deleting", WAIT, || pausing.entered())
        .await;
    assert!(
        record(&a, "s1").await.retiring.is_some(),
        "marked before it deletes"
    );
    // The seat is added back meanwhile; the node reads the marked record
    // and waits on it (it reads the record again and again until the mark
    // clears).
    let reads = store.gets(StateBucket::Mailboxes, "s1");
    company::apply(&*a.store, COMPANY, &[echo_role("s0"), echo_role("s1")])
        .await
        .unwrap();
    f.until("the node waits on the retirement's mark", WAIT, || {
        store.gets(StateBucket::Mailboxes, "s1") > reads
    })
    .await;
    pausing.go();
    let r = retiring.await.unwrap();
    assert_eq!(r.retired, vec!["s1"], "{r:?}");
    f.until_async("s1 has a new, empty mailbox", WAIT, || async {
        pending(&a, "s1").await == Some(0)
    })
    .await;
    f.until("a holds s1 again", WAIT, || a.holds("s1")).await;
    a.publish("s1", &trigger("new-mail", serde_json::json!({})))
        .await;
    f.until("the new mail runs", WAIT, || {
        !a.turns_of("new-mail").is_empty()
    })
    .await;
    assert!(
        a.turns_of("late-mail").is_empty(),
        "the old backlog is gone"
    );
    let rec = record(&a, "s1").await;
    assert_eq!(
        (rec.retiring, rec.absent_since_ms),
        (None, None),
        "registered afresh"
    );
    assert!(
        a.matching(|e| match e {
            Event::SeatMailboxRetirementTakenOver { seat } => Some(seat.clone()),
            _ => None,
        })
        .is_empty(),
        "the retirement finished in time: nothing was taken over"
    );
}

async fn a_removed_seats_mailbox_is_retired_after_the_grace_not_before_and_its_memory_is_kept(
    f: Fleet,
) {
    let a = f.node("a", &[echo_role("s0"), echo_role("s1")]).await;
    f.until("a holds both", WAIT, || a.holds("s0") && a.holds("s1"))
        .await;
    a.turns
        .memory()
        .diary_write("s1", "something s1 learned", None)
        .await
        .unwrap();
    remove_s1_with_mail(&f, &a).await;
    let s = sweep(&a);
    let first = s.tick().await;
    assert_eq!(first.absent, vec!["s1"], "{first:?}");
    let again = s.tick().await;
    assert!(again.retired.is_empty(), "not before the grace: {again:?}");
    assert_eq!(pending(&a, "s1").await, Some(1), "the mail is kept");
    let started = tokio::time::Instant::now();
    let mut retired = false;
    while !retired {
        assert!(started.elapsed() < WAIT, "never retired");
        retired = s.tick().await.retired == vec!["s1".to_string()];
        if !retired {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    assert!(started.elapsed() >= GRACE - Duration::from_millis(500));
    assert_eq!(
        pending(&a, "s1").await,
        None,
        "the mailbox and its mail are gone"
    );
    let names: Vec<String> = a
        .queue
        .list_subscriptions()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert!(!names.iter().any(|n| n.ends_with("-s1")), "{names:?}");
    assert!(names.contains(&"agent-s0".to_string()));
    assert!(
        a.store
            .get(StateBucket::Mailboxes, "s1")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        a.store.lease("seat:s1").await.unwrap().is_none(),
        "the retirement's claim is released"
    );
    let notes = a.turns.memory().diary("s1", 10).await.unwrap();
    assert_eq!(notes.len(), 1, "the seat's memory is kept");
}

async fn a_seat_restored_within_the_grace_comes_back_to_its_mail(f: Fleet) {
    let mut a = f.node("a", &[echo_role("s0"), echo_role("s1")]).await;
    f.until("a holds both", WAIT, || a.holds("s0") && a.holds("s1"))
        .await;
    remove_s1_with_mail(&f, &a).await;
    let s = sweep(&a);
    assert_eq!(s.tick().await.absent, vec!["s1"]);
    company::apply(&*a.store, COMPANY, &[echo_role("s0"), echo_role("s1")])
        .await
        .unwrap();
    let watch = a.engine.company_watch();
    f.until("the restore is applied", WAIT, || {
        watch.borrow().roles.len() == 2
    })
    .await;
    assert_eq!(s.tick().await.returned, vec!["s1"]);
    f.until("s1 works the mail it was sent while gone", WAIT, || {
        !a.turns_of("late-mail").is_empty()
    })
    .await;
    let rec: MailboxRecord = serde_json::from_slice(
        &a.store
            .get(StateBucket::Mailboxes, "s1")
            .await
            .unwrap()
            .unwrap()
            .value,
    )
    .unwrap();
    assert_eq!(rec.absent_since_ms, None);
}

async fn two_nodes_sweeping_at_once_retire_exactly_once(f: Fleet) {
    let a = f.node("a", &[echo_role("s0"), echo_role("s1")]).await;
    let b = f.node("b", &[]).await;
    f.until("the seats are held", WAIT, || {
        (a.holds("s1") || b.holds("s1")) && (a.holds("s0") || b.holds("s0"))
    })
    .await;
    company::apply(&*a.store, COMPANY, &[echo_role("s0")])
        .await
        .unwrap();
    let (wa, wb) = (a.engine.company_watch(), b.engine.company_watch());
    f.until("both applied the removal and s1 is free", WAIT, || {
        wa.borrow().roles.len() == 1
            && wb.borrow().roles.len() == 1
            && !a.holds("s1")
            && !b.holds("s1")
    })
    .await;
    let (sa, sb) = (sweep(&a), sweep(&b));
    f.until_async("s1's lease is gone", WAIT, || async {
        a.store.lease("seat:s1").await.unwrap().is_none()
    })
    .await;
    let stamped = sa.tick().await;
    assert_eq!(stamped.absent, vec!["s1"]);
    tokio::time::sleep(GRACE).await;
    let (ra, rb) = tokio::join!(sa.tick(), sb.tick());
    let retired = ra.retired.len() + rb.retired.len();
    assert_eq!(retired, 1, "exactly one retires: {ra:?} {rb:?}");
    assert_eq!(pending(&a, "s1").await, None);
}

async fn a_seat_added_back_during_a_retirement_starts_with_an_empty_inbox(f: Fleet) {
    let mut a = f.node("a", &[echo_role("s0"), echo_role("s1")]).await;
    f.until("a holds both", WAIT, || a.holds("s0") && a.holds("s1"))
        .await;
    remove_s1_with_mail(&f, &a).await;
    // A retirement is in flight: its mark is on the record.
    let e = a
        .store
        .get(StateBucket::Mailboxes, "s1")
        .await
        .unwrap()
        .unwrap();
    let mut rec: MailboxRecord = serde_json::from_slice(&e.value).unwrap();
    let now = a.store.now().await.unwrap().unix_nanos() / 1_000_000;
    rec.absent_since_ms = Some(now);
    rec.retiring = Some(RetirementMark {
        by: "z:maintenance:1".into(),
        at_ms: now,
    });
    let marked = a
        .store
        .update(
            StateBucket::Mailboxes,
            "s1",
            Bytes::from(serde_json::to_vec(&rec).unwrap()),
            e.revision,
        )
        .await
        .unwrap();
    // The seat is added back while it runs: the node waits for the mark.
    company::apply(&*a.store, COMPANY, &[echo_role("s0"), echo_role("s1")])
        .await
        .unwrap();
    // The retirement finishes: mailbox deleted, record deleted.
    for g in ["agent-s1", "control-s1", "reflect-s1"] {
        a.queue.delete_subscription(g).await.unwrap();
    }
    a.store
        .delete(StateBucket::Mailboxes, "s1", marked)
        .await
        .unwrap();
    // The node then registers the seat afresh and creates a new, empty
    // mailbox, which nothing deletes.
    f.until_async("s1 has a new mailbox", WAIT, || async {
        pending(&a, "s1").await == Some(0)
    })
    .await;
    f.until("a holds s1 again", WAIT, || a.holds("s1")).await;
    a.publish("s1", &trigger("new-mail", serde_json::json!({})))
        .await;
    f.until("the new mail runs", WAIT, || {
        !a.turns_of("new-mail").is_empty()
    })
    .await;
    assert!(
        a.turns_of("late-mail").is_empty(),
        "the old backlog is gone"
    );
    assert!(
        a.store
            .get(StateBucket::Mailboxes, "s1")
            .await
            .unwrap()
            .is_some(),
        "registered again"
    );
}

async fn a_mailbox_whose_registration_failed_is_discovered_from_the_broker_listing(f: Fleet) {
    let mut a = f.node("a", &[echo_role("s0")]).await;
    f.until("a holds s0", WAIT, || a.holds("s0")).await;
    // A mailbox with no record, of a seat not in the company.
    ensure_seat_mailboxes(&*a.queue, "ghost", QueueSettings::default())
        .await
        .unwrap();
    // Another group on a seat's subject is somebody else's: not
    // discovered.
    a.queue
        .ensure_subscription(&crewlet::queue::SubscriptionSpec::new(
            "tap-stranger".into(),
            inbox_subject("stranger"),
            QueueSettings::default(),
        ))
        .await
        .unwrap();
    let report = sweep(&a).tick().await;
    assert_eq!(report.discovered, vec!["ghost"]);
    let discovered = a.matching(|e| match e {
        Event::SeatMailboxDiscovered { seat } => Some(seat.clone()),
        _ => None,
    });
    assert_eq!(discovered, vec!["ghost"]);
    let rec: MailboxRecord = serde_json::from_slice(
        &a.store
            .get(StateBucket::Mailboxes, "ghost")
            .await
            .unwrap()
            .unwrap()
            .value,
    )
    .unwrap();
    assert!(rec.absent_since_ms.is_some(), "stamped absent at once");
}

/// A duty that counts its ticks.
struct Counter {
    ticks: Arc<AtomicUsize>,
}

#[async_trait::async_trait]
impl Duty for Counter {
    fn name(&self) -> &'static str {
        "test-counter"
    }
    fn every(&self) -> Duration {
        Duration::from_millis(300)
    }
    async fn tick(&self) {
        self.ticks.fetch_add(1, Ordering::SeqCst);
    }
}

fn run_counter(n: &Node, tasks: &Tasks) -> (Duties, Arc<AtomicUsize>) {
    run_counter_over(n.store.clone(), n, tasks)
}

/// The counting duty of node `n`, claiming through `store`.
fn run_counter_over(
    store: Arc<dyn crewlet::coord::Store>,
    n: &Node,
    tasks: &Tasks,
) -> (Duties, Arc<AtomicUsize>) {
    let ticks = Arc::new(AtomicUsize::new(0));
    let duties = Duties::new();
    duties.start(
        tasks,
        DutyContext {
            store,
            node_id: n.engine.config().node_id.clone(),
            owner: n.engine.config().owner.clone(),
            protocol: 4,
            events: n.engine.events().clone(),
            watchdog: None,
        },
        Arc::new(Counter {
            ticks: ticks.clone(),
        }),
    );
    (duties, ticks)
}

/// A duty claim that errors skips the tick (spec § Singleton duties):
/// unknown ownership is not ownership. So does a renewal that cannot say.
/// Each absence of a tick is proven over ticks the loop provably took —
/// the fault counts every claim or renewal it refused — never over a
/// length of time.
async fn a_duty_claim_or_renewal_that_errors_skips_the_tick(f: Fleet) {
    use duty_faults::{Fault, FaultyStore};
    let a = f.node("a", &[echo_role("s0")]).await;
    let claim = Fault::Claim("worker:test-counter".into());
    let faulty = FaultyStore::new(a.store.clone(), std::slice::from_ref(&claim));
    let tasks = Tasks::new();
    let (_duties, ticks) = run_counter_over(faulty.clone(), &a, &tasks);
    f.until("three claims have errored", WAIT, || {
        faulty.hits(&claim) >= 3
    })
    .await;
    assert_eq!(ticks.load(Ordering::SeqCst), 0, "nothing ran unclaimed");
    assert!(
        a.store
            .lease("worker:test-counter")
            .await
            .unwrap()
            .is_none(),
        "nothing was taken"
    );
    faulty.heal();
    f.until("the duty runs once the claim answers", WAIT, || {
        ticks.load(Ordering::SeqCst) >= 1
    })
    .await;
    // Held now: a renewal that cannot say skips its tick too. Once the
    // first renewal has failed, the tick before it has finished.
    let renew = Fault::Renew("worker:test-counter".into());
    faulty.set(std::slice::from_ref(&renew));
    f.until("a renewal could not say", WAIT, || faulty.hits(&renew) >= 1)
        .await;
    let ran = ticks.load(Ordering::SeqCst);
    f.until("three more renewals could not say", WAIT, || {
        faulty.hits(&renew) >= 4
    })
    .await;
    assert_eq!(
        ticks.load(Ordering::SeqCst),
        ran,
        "a tick ran on an unknown renewal"
    );
    faulty.heal();
    f.until("the duty runs again", WAIT, || {
        ticks.load(Ordering::SeqCst) > ran
    })
    .await;
    tasks.shutdown().await;
}

async fn a_duty_moves_to_a_peer_when_its_holder_dies(f: Fleet) {
    let mut a = f.node("a", &[echo_role("s0")]).await;
    let b = f.node("b", &[]).await;
    let (ta, tb) = (Tasks::new(), Tasks::new());
    let (da, ca) = run_counter(&a, &ta);
    f.until("a runs the duty", WAIT, || ca.load(Ordering::SeqCst) >= 2)
        .await;
    let (_db, cb) = run_counter(&b, &tb);
    // While a holds it, b never runs it.
    let before = ca.load(Ordering::SeqCst);
    f.until("a ticks on", WAIT, || {
        ca.load(Ordering::SeqCst) >= before + 3
    })
    .await;
    assert_eq!(cb.load(Ordering::SeqCst), 0);
    // a dies: nothing is given back, the lease lapses, b takes over.
    da.abandon();
    ta.shutdown().await;
    f.until("b runs the duty", WAIT, || cb.load(Ordering::SeqCst) >= 1)
        .await;
    assert!(
        a.matching(|e| match e {
            Event::DutyReleased { .. } => Some(()),
            _ => None,
        })
        .is_empty(),
        "a crash gives nothing back"
    );
    tb.shutdown().await;
}

async fn a_graceful_stop_gives_a_duty_back_at_once(f: Fleet) {
    let mut a = f.node("a", &[echo_role("s0")]).await;
    let b = f.node("b", &[]).await;
    let (ta, tb) = (Tasks::new(), Tasks::new());
    let (_da, ca) = run_counter(&a, &ta);
    f.until("a runs the duty", WAIT, || ca.load(Ordering::SeqCst) >= 1)
        .await;
    let (_db, cb) = run_counter(&b, &tb);
    let a_owner = a.engine.config().owner.clone();
    ta.shutdown().await;
    // Given back at once: the lease is free (or already b's), not left to
    // lapse.
    let lease = a.store.lease("worker:test-counter").await.unwrap();
    assert!(
        lease.as_ref().is_none_or(|l| l.owner != a_owner),
        "{lease:?}"
    );
    let released = a.matching(|e| match e {
        Event::DutyReleased { duty } => Some(duty.clone()),
        _ => None,
    });
    assert_eq!(released, vec!["test-counter"]);
    f.until("b runs the duty", WAIT, || cb.load(Ordering::SeqCst) >= 1)
        .await;
    tb.shutdown().await;
}

async fn a_schedule_fires_once_per_due_time_on_a_three_node_fleet(f: Fleet) {
    // Seat s0 never runs on these nodes' turn engines: pin it elsewhere,
    // so the fired triggers stay in its inbox to be counted.
    let roles = [pinned("s0", "elsewhere")];
    let first = f.node("n1", &roles).await;
    let every_second = ScheduleConfig {
        name: "tick".into(),
        seat: "s0".into(),
        cron: "* * * * * *".into(),
        kind: "task_assigned".into(),
        body: serde_json::json!({"report": "daily"}),
    };
    company::apply_with_schedules(&*first.store, COMPANY, &roles, &[every_second])
        .await
        .unwrap();
    let nodes = [first, f.node("n2", &[]).await, f.node("n3", &[]).await];
    let mut buses: Vec<tokio::sync::broadcast::Receiver<crewlet::events::FleetEvent>> = Vec::new();
    let mut running = Vec::new();
    for n in &nodes {
        let watch = n.engine.company_watch();
        f.until("the schedule is applied", WAIT, || {
            !watch.borrow().schedules.is_empty()
        })
        .await;
        let bus: EventBus = n.engine.events().clone();
        buses.push(bus.subscribe());
        let t = Tasks::new();
        let d = Duties::new();
        d.start(
            &t,
            DutyContext {
                store: n.store.clone(),
                node_id: n.engine.config().node_id.clone(),
                owner: n.engine.config().owner.clone(),
                protocol: 4,
                events: bus.clone(),
                watchdog: None,
            },
            Arc::new(Scheduler::new(
                Duration::from_millis(400),
                n.store.clone(),
                n.queue.clone(),
                bus,
                watch,
            )),
        );
        running.push((t, d));
    }
    let mut fired: Vec<(usize, String)> = Vec::new();
    let drain = |buses: &mut Vec<tokio::sync::broadcast::Receiver<crewlet::events::FleetEvent>>,
                 fired: &mut Vec<(usize, String)>| {
        for (i, rx) in buses.iter_mut().enumerate() {
            while let Ok(e) = rx.try_recv() {
                if let Event::ScheduleFired { trigger_id, .. } = e.event {
                    fired.push((i, trigger_id));
                }
            }
        }
    };
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut killed = None;
    while fired.len() < 8 {
        assert!(tokio::time::Instant::now() < deadline, "fired {fired:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        drain(&mut buses, &mut fired);
        // The first holder dies part way: the duty moves once.
        if killed.is_none() && fired.len() >= 3 {
            let holder = fired[0].0;
            running[holder].1.abandon();
            killed = Some(holder);
        }
    }
    for (t, _) in &running {
        t.shutdown().await;
    }
    drain(&mut buses, &mut fired);
    let holders: std::collections::BTreeSet<usize> = fired.iter().map(|(i, _)| *i).collect();
    assert!(holders.len() >= 2, "the duty moved: {fired:?}");
    let mut ids: Vec<&String> = fired.iter().map(|(_, id)| id).collect();
    ids.sort();
    let before = ids.len();
    ids.dedup();
    assert_eq!(ids.len(), before, "a due time fired twice: {fired:?}");
    assert_eq!(
        pending(&nodes[0], "s0").await.unwrap(),
        before as u64,
        "each fire reached the seat's inbox once"
    );
}

mod single {
    //! The parts of the sweep and the maintenance pass that need no second
    //! node, on the twin.
    use super::*;
    use crewlet::duty::mailboxes::{RETIREMENT_BUDGET, wait_out_retirement};
    use crewlet::duty::maintenance::Maintenance;

    async fn node(f: &Fleet) -> Node {
        let a = f.node("a", &[echo_role("s0"), echo_role("s1")]).await;
        f.until("a holds both", WAIT, || a.holds("s0") && a.holds("s1"))
            .await;
        a
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_node_behind_the_fleets_revision_stamps_nothing() {
        let f = Fleet::new(Kind::Twin).await;
        let a = node(&f).await;
        // This sweep has applied only the revision it started with.
        let (_tx, stale) = tokio::sync::watch::channel(a.engine.company());
        company::apply(&*a.store, COMPANY, &[echo_role("s0")])
            .await
            .unwrap();
        let s = MailboxSweep {
            company: stale,
            ..sweep(&a)
        };
        let r = s.tick().await;
        assert!(r.absent.is_empty() && r.retired.is_empty(), "{r:?}");
        assert!(
            r.unknown.as_deref().is_some_and(|u| u.contains("revision")),
            "{r:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_removed_seat_still_leased_is_not_retired_and_says_who_holds_it() {
        let f = Fleet::new(Kind::Twin).await;
        let mut a = node(&f).await;
        remove_s1_with_mail(&f, &a).await;
        let s = sweep(&a);
        assert_eq!(s.tick().await.absent, vec!["s1"]);
        // A node still serving an older revision holds the seat.
        let req = crewlet::coord::ClaimRequest::new("seat:s1", "old:1", "old-node");
        assert!(matches!(
            a.store.claim(req).await.unwrap(),
            crewlet::coord::Claim::Won(_)
        ));
        tokio::time::sleep(GRACE).await;
        let r = s.tick().await;
        assert_eq!(r.held, vec!["s1"], "{r:?}");
        assert_eq!(pending(&a, "s1").await, Some(1), "the mail is kept");
        let held = a.matching(|e| match e {
            Event::SeatMailboxRetirementHeld {
                seat,
                refused,
                holder,
            } => Some((seat.clone(), refused.clone(), holder.clone())),
            _ => None,
        });
        assert_eq!(
            held,
            vec![("s1".into(), "held".into(), Some("old-node".into()))]
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_retirement_that_does_not_finish_is_taken_over_by_the_node_adding_the_seat_back() {
        let f = Fleet::new(Kind::Twin).await;
        let mut a = node(&f).await;
        let e = a
            .store
            .get(StateBucket::Mailboxes, "s1")
            .await
            .unwrap()
            .unwrap();
        let mut rec: MailboxRecord = serde_json::from_slice(&e.value).unwrap();
        rec.retiring = Some(RetirementMark {
            by: "dead:maintenance:1".into(),
            at_ms: 0,
        });
        a.store
            .update(
                StateBucket::Mailboxes,
                "s1",
                Bytes::from(serde_json::to_vec(&rec).unwrap()),
                e.revision,
            )
            .await
            .unwrap();
        assert!(RETIREMENT_BUDGET > Duration::from_millis(100));
        wait_out_retirement(
            &*a.store,
            "s1",
            a.engine.events(),
            Duration::from_millis(100),
        )
        .await;
        let after: MailboxRecord = serde_json::from_slice(
            &a.store
                .get(StateBucket::Mailboxes, "s1")
                .await
                .unwrap()
                .unwrap()
                .value,
        )
        .unwrap();
        assert_eq!(after.retiring, None);
        assert_eq!(
            a.matching(|e| match e {
                Event::SeatMailboxRetirementTakenOver { seat } => Some(seat.clone()),
                _ => None,
            }),
            vec!["s1"]
        );
    }

    /// The maintenance pass itself applies the node's retention: diary
    /// notes past their expiry go, each seat keeps at most `diary_cap`
    /// notes (its newest), and audit rows older than `audit_days` go while
    /// newer ones stay. `audit_days = 0` keeps the audit log whole.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_maintenance_pass_expires_and_caps_the_diary_and_deletes_audit_rows_past_the_retention()
     {
        let f = Fleet::new(Kind::Twin).await;
        let a = node(&f).await;
        let memory = a.turns.memory().clone();
        let pool = memory.pool().clone();
        for note in ["s0 one", "s0 two", "s0 three", "s0 four"] {
            assert!(memory.diary_write("s0", note, None).await.unwrap());
        }
        assert!(memory.diary_write("s1", "s1 one", None).await.unwrap());
        let stamp = |days: i64| {
            (time::OffsetDateTime::now_utc() + time::Duration::days(days))
                .replace_nanosecond(0)
                .unwrap()
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap()
        };
        // "s0 one" has expired; "s0 four" expires next week.
        for (note, days) in [("s0 one", -1), ("s0 four", 7)] {
            sqlx::query("UPDATE agent_diary SET expires_at = ? WHERE content = ?")
                .bind(stamp(days))
                .bind(note)
                .execute(&pool)
                .await
                .unwrap();
        }
        for (at, action) in [
            (stamp(-40), "old"),
            (stamp(-10), "recent"),
            (stamp(0), "now"),
        ] {
            sqlx::query(
                "INSERT INTO audit (at, person, action, seat, reason, result) VALUES (?, 'p', ?, NULL, NULL, 'ok')",
            )
            .bind(at)
            .bind(action)
            .execute(&pool)
            .await
            .unwrap();
        }
        let audit = || async {
            let mut v: Vec<String> = sqlx::query_scalar("SELECT action FROM audit")
                .fetch_all(&pool)
                .await
                .unwrap();
            v.sort();
            v
        };
        let pass = |audit_days: u64| Maintenance {
            every: Duration::from_secs(900),
            memory: memory.clone(),
            pool: pool.clone(),
            diary_cap: 2,
            audit_days,
            marker_age: crewlet::duty::maintenance::MARKER_AGE,
            sweep: sweep(&a),
        };
        let kept = pass(0).pass().await;
        assert_eq!(kept.audit_deleted, 0, "{kept:?}");
        assert_eq!(audit().await, vec!["now", "old", "recent"]);
        // That pass applied the diary's retention already.
        assert_eq!(
            (kept.diary_expired, kept.diary_over_cap),
            (1, 1),
            "{kept:?}"
        );
        let notes: Vec<String> = memory
            .diary("s0", 10)
            .await
            .unwrap()
            .into_iter()
            .map(|n| n.content)
            .collect();
        assert_eq!(
            notes,
            vec!["s0 four", "s0 three"],
            "the newest two are kept"
        );
        assert_eq!(memory.diary("s1", 10).await.unwrap().len(), 1);
        let r = pass(30).pass().await;
        assert_eq!(r.audit_deleted, 1, "{r:?}");
        assert_eq!((r.diary_expired, r.diary_over_cap), (0, 0), "{r:?}");
        assert_eq!(audit().await, vec!["now", "recent"]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn removal_markers_are_purged_through_their_own_revision_and_a_key_written_since_is_untouched()
     {
        markers_are_purged_in(StateBucket::Pauses).await;
    }

    /// The run and approval records' bucket has no age either: its
    /// markers are purged the same way (the spec: every shared-state bucket
    /// with no age).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn removal_markers_of_deleted_run_records_are_purged_too() {
        markers_are_purged_in(StateBucket::Runs).await;
    }

    /// Two keys deleted in `bucket`, one written again after its marker
    /// was listed; one maintenance pass purges the other's marker and
    /// leaves the rewritten key alone.
    async fn markers_are_purged_in(bucket: StateBucket) {
        let f = Fleet::new(Kind::Twin).await;
        let a = node(&f).await;
        let put = |k: &'static str| {
            let store = a.store.clone();
            async move {
                store
                    .create(bucket, k, Bytes::from_static(b"{}"))
                    .await
                    .unwrap()
            }
        };
        let gone = put("gone").await;
        a.store.delete(bucket, "gone", gone).await.unwrap();
        let back = put("back").await;
        a.store.delete(bucket, "back", back).await.unwrap();
        let markers = a.store.markers(bucket, "").await.unwrap();
        assert_eq!(markers.len(), 2, "{bucket:?}: {markers:?}");
        // "back" is written again after its marker was listed.
        put("back").await;
        let m = Maintenance {
            every: Duration::from_secs(900),
            memory: a.turns.memory().clone(),
            pool: a.turns.memory().pool().clone(),
            diary_cap: 0,
            audit_days: 0,
            marker_age: Duration::ZERO,
            sweep: sweep(&a),
        };
        let r = m.pass().await;
        assert!(r.markers_purged >= 1, "{bucket:?}: {r:?}");
        assert!(
            a.store.markers(bucket, "gone").await.unwrap().is_empty(),
            "{bucket:?}: the deleted key's marker is purged"
        );
        assert!(
            a.store.get(bucket, "back").await.unwrap().is_some(),
            "{bucket:?}: a key written since is untouched"
        );
    }
}

mod retirement_races {
    //! A retirement racing a node that adds the seat back, and a delete
    //! the broker refuses. The queue here is the real one, with an actor
    //! standing in the middle of a delete: the other party of the race.
    use super::*;
    use crewlet::queue::{
        Attachment, DeadLetter, Handler, Queue, QueueError, SubscriptionInfo, SubscriptionSpec,
    };
    use std::sync::Arc;

    #[derive(Clone, Copy, PartialEq)]
    enum Act {
        /// Right after the inbox is deleted, a node adding the seat back
        /// takes the record over and creates its new mailbox — which the
        /// retirement's next deletes then land on.
        TakeOver,
        /// The broker refuses to delete the control subscription.
        Refuse,
    }

    struct Racing {
        inner: Arc<dyn Queue>,
        store: Arc<dyn crewlet::coord::Store>,
        act: Act,
    }

    #[async_trait::async_trait]
    impl Queue for Racing {
        async fn ensure_subscription(&self, spec: &SubscriptionSpec) -> Result<(), QueueError> {
            self.inner.ensure_subscription(spec).await
        }
        async fn delete_subscription(&self, name: &str) -> Result<bool, QueueError> {
            if self.act == Act::Refuse && name == "control-s1" {
                return Err(QueueError::Backend("refused by the broker".into()));
            }
            let r = self.inner.delete_subscription(name).await;
            if self.act == Act::TakeOver && name == "agent-s1" {
                let e = self
                    .store
                    .get(StateBucket::Mailboxes, "s1")
                    .await
                    .unwrap()
                    .unwrap();
                let mut rec: MailboxRecord = serde_json::from_slice(&e.value).unwrap();
                rec.retiring = None;
                rec.absent_since_ms = None;
                self.store
                    .update(
                        StateBucket::Mailboxes,
                        "s1",
                        Bytes::from(serde_json::to_vec(&rec).unwrap()),
                        e.revision,
                    )
                    .await
                    .unwrap();
                ensure_seat_mailboxes(&*self.inner, "s1", QueueSettings::default())
                    .await
                    .unwrap();
            }
            r
        }
        async fn list_subscriptions(&self) -> Result<Vec<SubscriptionInfo>, QueueError> {
            self.inner.list_subscriptions().await
        }
        async fn publish(
            &self,
            subject: &str,
            msg_id: Option<&str>,
            payload: Bytes,
        ) -> Result<bool, QueueError> {
            self.inner.publish(subject, msg_id, payload).await
        }
        async fn attach(
            &self,
            name: &str,
            holds: &[&str],
            handler: Arc<dyn Handler>,
        ) -> Result<Attachment, QueueError> {
            self.inner.attach(name, holds, handler).await
        }
        async fn pending(&self, name: &str) -> Result<u64, QueueError> {
            self.inner.pending(name).await
        }
        async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, QueueError> {
            self.inner.dead_letters(limit).await
        }
        async fn dead_letter_count(&self) -> Result<u64, QueueError> {
            self.inner.dead_letter_count().await
        }
        async fn find_dead_letter(&self, id: u64) -> Result<Option<DeadLetter>, QueueError> {
            self.inner.find_dead_letter(id).await
        }
        async fn discard_dead_letter(&self, id: u64) -> Result<bool, QueueError> {
            self.inner.discard_dead_letter(id).await
        }
    }

    async fn absent_past_the_grace(f: &Fleet) -> Node {
        let a = f.node("a", &[echo_role("s0"), echo_role("s1")]).await;
        f.until("a holds both", WAIT, || a.holds("s0") && a.holds("s1"))
            .await;
        remove_s1_with_mail(f, &a).await;
        f.until_async("s1's lease is gone", WAIT, || async {
            a.store.lease("seat:s1").await.unwrap().is_none()
        })
        .await;
        assert_eq!(sweep(&a).tick().await.absent, vec!["s1"]);
        tokio::time::sleep(GRACE).await;
        a
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_retirement_whose_record_was_taken_over_restores_the_new_inbox() {
        let f = Fleet::new(Kind::Twin).await;
        let a = absent_past_the_grace(&f).await;
        let s = MailboxSweep {
            queue: Arc::new(Racing {
                inner: a.queue.clone(),
                store: a.store.clone(),
                act: Act::TakeOver,
            }),
            ..sweep(&a)
        };
        let r = s.tick().await;
        assert!(r.retired.is_empty(), "{r:?}");
        // The new holder's mailbox is there, whatever order the deletes
        // and its creates landed in.
        let names: Vec<String> = a
            .queue
            .list_subscriptions()
            .await
            .unwrap()
            .into_iter()
            .map(|s| s.name)
            .collect();
        for g in ["agent-s1", "control-s1", "reflect-s1"] {
            assert!(names.contains(&g.to_string()), "{g} missing: {names:?}");
        }
        let rec: MailboxRecord = serde_json::from_slice(
            &a.store
                .get(StateBucket::Mailboxes, "s1")
                .await
                .unwrap()
                .unwrap()
                .value,
        )
        .unwrap();
        assert_eq!(rec.retiring, None, "the record is the new holder's");
    }

    /// A resumed retirement that cannot delete is unmarked like any other:
    /// the dead sweep's mark does not come back with the record.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_resumed_retirement_whose_delete_is_refused_is_unmarked_not_left_with_the_dead_mark()
    {
        use crewlet::duty::mailboxes::RESUME_AFTER;
        let f = Fleet::new(Kind::Twin).await;
        let mut a = absent_past_the_grace(&f).await;
        mark_as_if_a_dead_sweep(&a, "s1", RESUME_AFTER + Duration::from_secs(1)).await;
        let refusing = MailboxSweep {
            queue: Arc::new(Racing {
                inner: a.queue.clone(),
                store: a.store.clone(),
                act: Act::Refuse,
            }),
            ..sweep(&a)
        };
        assert!(refusing.tick().await.retired.is_empty());
        let rec = record(&a, "s1").await;
        assert_eq!(rec.retiring, None, "unmarked");
        assert!(rec.absent_since_ms.is_some(), "still absent");
        // The next tick retires it as a plain retirement, not a resume.
        assert_eq!(sweep(&a).tick().await.retired, vec!["s1"]);
        let resumed = a.matching(|e| match e {
            Event::SeatMailboxRetirementResumed { seat } => Some(seat.clone()),
            _ => None,
        });
        assert_eq!(resumed, vec!["s1"], "resumed once");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_delete_the_broker_refuses_unmarks_the_retirement_and_the_next_tick_retries() {
        let f = Fleet::new(Kind::Twin).await;
        let a = absent_past_the_grace(&f).await;
        let refusing = MailboxSweep {
            queue: Arc::new(Racing {
                inner: a.queue.clone(),
                store: a.store.clone(),
                act: Act::Refuse,
            }),
            ..sweep(&a)
        };
        assert!(refusing.tick().await.retired.is_empty());
        let rec: MailboxRecord = serde_json::from_slice(
            &a.store
                .get(StateBucket::Mailboxes, "s1")
                .await
                .unwrap()
                .unwrap()
                .value,
        )
        .unwrap();
        assert_eq!(rec.retiring, None, "unmarked");
        assert!(rec.absent_since_ms.is_some(), "still absent");
        assert!(
            a.store.lease("seat:s1").await.unwrap().is_none(),
            "the retirement's claim is released"
        );
        // The next tick (the broker answering again) retires it.
        assert_eq!(sweep(&a).tick().await.retired, vec!["s1"]);
    }
}
