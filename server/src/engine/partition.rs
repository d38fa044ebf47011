//! What a seat's deliveries come to, decided by pure functions the turn
//! dispatcher (`engine::runtime`) executes: what each delivery of a batch
//! is ([`sort_batch`]: a trigger, a run's completion, an approval's
//! answer, mail that runs no turn, poison), which deliveries of a
//! partition run as one turn and which the ledger already covers
//! ([`plan_partition`]), what a resume's claim on its run answered
//! ([`after_resume_claim`]), and what is done once a turn has ended
//! ([`closing`]) — the ledger record right behind the effects, the agent
//! told of a turn that did not finish, the disposition, and how long a
//! turn that failed before reaching outside waits to run again
//! ([`retry_delay`]). Each is tested by its exact answer below.

use std::time::Duration;

use super::envelope::{ENGINE_TYPES, Envelope};
use super::ledger::Screened;
use super::runs::{RunError, RunRecord, RunState};
use super::turn::{Ending, Verdict, settle};
use crate::queue::{Delivery, Disposition};

/// One delivery of a partition: its position in the batch, its envelope
/// and its delivery count.
pub type Entry = (usize, Envelope, u64);

/// What each delivery of a batch is, by its envelope.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Batch {
    /// The triggers a turn may run (screened by the ledger next).
    pub triggers: Vec<Entry>,
    /// Completions of detached runs: each resumes its run's turn.
    pub resumes: Vec<Entry>,
    /// A person's answers to approvals: each resumes the waiting call.
    pub answers: Vec<Entry>,
    /// Mail the ledger does not keep: acked, no turn runs
    /// (`turn_trigger_ignored`).
    pub ignored: Vec<(usize, Envelope)>,
    /// What does not decode as an envelope: poison, and why.
    pub poison: Vec<(usize, String)>,
}

/// Pure: what each of `ds` is. The engine's own two kinds
/// ([`ENGINE_TYPES`]: a run's completion, an approval's answer) resume
/// what waits for them; every other ledgered kind is a trigger.
pub fn sort_batch(ds: &[Delivery]) -> Batch {
    let [run_completed, approval_answered] = ENGINE_TYPES;
    let mut b = Batch::default();
    for (i, d) in ds.iter().enumerate() {
        match Envelope::decode(&d.payload) {
            Err(e) => b.poison.push((i, e.to_string())),
            Ok(env) if env.kind == run_completed => b.resumes.push((i, env, d.delivered)),
            Ok(env) if env.kind == approval_answered => b.answers.push((i, env, d.delivered)),
            Ok(env) if !env.is_ledgered() => b.ignored.push((i, env)),
            Ok(env) => b.triggers.push((i, env, d.delivered)),
        }
    }
    b
}

/// The plan for one partition once the ledger has screened it.
#[derive(Clone, Debug, PartialEq)]
pub struct PartitionPlan {
    /// Positions acked without a turn: the ledger holds them finished, or
    /// they repeat an id already in this turn.
    pub acks: Vec<usize>,
    /// Positions the turn answers.
    pub runs: Vec<usize>,
    /// The turn's triggers, one per event id, in arrival order (empty: no
    /// turn runs).
    pub triggers: Vec<Envelope>,
    /// The highest delivery count among the runs (1 when none).
    pub delivered: u64,
}

/// Pure: which deliveries of `partition` the turn runs, by `screened`.
pub fn plan_partition(partition: &[Entry], screened: &Screened) -> PartitionPlan {
    let mut plan = PartitionPlan {
        acks: Vec::new(),
        runs: Vec::new(),
        triggers: Vec::new(),
        delivered: 1,
    };
    let mut max_delivered = None;
    for (i, e, delivered) in partition {
        if screened.run.iter().any(|r| r.id == e.id) {
            plan.runs.push(*i);
            max_delivered = max_delivered.max(Some(*delivered));
            if !plan.triggers.iter().any(|t| t.id == e.id) {
                plan.triggers.push(e.clone());
            }
        } else {
            plan.acks.push(*i);
        }
    }
    plan.delivered = max_delivered.unwrap_or(1);
    plan
}

/// What the dispatcher does once a turn has ended.
#[derive(Clone, Debug, PartialEq)]
pub struct Closing {
    /// Record the triggers in the completion ledger, right behind the
    /// effects (what keeps a redelivery from running them again).
    pub record: bool,
    /// Write what a finished turn leaves behind (a parked turn is complete
    /// for now: its continuation is the run's resume).
    pub after_turn: bool,
    /// Tell the agent the turn is over: no results come for its last round.
    pub abort: bool,
    /// A resume keeps its claim on the run (it finished or acted); else the
    /// claim is given back and the completion comes again.
    pub keep_claim: bool,
    /// `turn_trigger_skipped` for each trigger, with this reason.
    pub given_up: Option<&'static str>,
    /// `turn.guard_breach`, and the seat's last error set.
    pub guard_breach: bool,
    pub disposition: Disposition,
}

/// How long a failed turn's mail waits before it is delivered again
/// (`stream.retry_delay_seconds`, `stream.retry_delay_max_seconds`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    pub first: Duration,
    pub max: Duration,
}

/// Pure: the wait before the next delivery of mail whose turn failed
/// before anything reached outside, on its `delivered`-th delivery: the
/// first wait, doubled for each delivery before this one, never past the
/// longest. A provider that is down is asked again after 1 s, 2 s, 4 s …
/// rather than once a second for the whole delivery budget.
pub fn retry_delay(delivered: u64, policy: RetryPolicy) -> Duration {
    let doublings = delivered.saturating_sub(1).min(32) as u32;
    policy
        .first
        .checked_mul(1u32 << doublings.min(31))
        .unwrap_or(policy.max)
        .min(policy.max)
}

/// Pure: how a turn that ended with `ending` is closed. `resume` says the
/// turn resumed a detached run (its deferral names it so); `retry` is how
/// long its mail waits when it is handed back ([`retry_delay`]).
pub fn closing(
    ending: &Ending,
    reached_outside: bool,
    handle: &str,
    turn_id: &str,
    resume: bool,
    retry: Duration,
) -> Closing {
    let s = settle(ending, reached_outside);
    let what = if resume { "resume turn" } else { "turn" };
    Closing {
        record: s.record,
        after_turn: !resume && matches!(ending, Ending::Done { .. } | Ending::Parked { .. }),
        abort: !matches!(ending, Ending::Done { .. }),
        keep_claim: s.verdict == Verdict::Ack,
        given_up: if resume { None } else { s.given_up },
        guard_breach: s.guard_breach,
        disposition: match s.verdict {
            Verdict::Ack => Disposition::Ack,
            Verdict::Nak if retry.is_zero() => Disposition::Nak,
            Verdict::Nak => Disposition::Retry(retry),
            Verdict::Defer => {
                Disposition::Defer(format!("seat {handle:?} moved during {what} {turn_id}"))
            }
        },
    }
}

/// The name of a disposition in `turn_completed`.
pub fn disposition_name(d: &Disposition) -> &'static str {
    match d {
        Disposition::Ack => "ack",
        Disposition::Nak | Disposition::Retry(_) => "nak",
        Disposition::Defer(_) => "defer",
        Disposition::Poison(_) => "poison",
    }
}

/// What a resume's claim on its run came to, when it did not win it.
#[derive(Clone, Debug, PartialEq)]
pub enum ClaimRefused {
    /// Nothing to resume (ended, already resumed, no record): acked, with
    /// the line logged.
    Dropped(&'static str),
    /// The run is owned at a later epoch: the delivery belongs elsewhere.
    Fenced(Disposition),
    /// The store did not answer: the completion comes again.
    Retry(String),
}

/// Pure: the claim's answer, `Ok` when this resume took it. `won` says
/// whether the claim rule let this call take the run.
pub fn after_resume_claim(
    claim: Result<RunRecord, RunError>,
    won: bool,
    run_id: &str,
) -> Result<RunRecord, ClaimRefused> {
    match claim {
        Ok(r) if won => Ok(r),
        Ok(r) if r.state == RunState::Ended => Err(ClaimRefused::Dropped(
            "a completion for a run that was ended; dropped",
        )),
        Ok(_) => Err(ClaimRefused::Dropped(
            "a run's completion again: already resumed",
        )),
        Err(RunError::NotFound(_)) => Err(ClaimRefused::Dropped(
            "a completion for a run with no record (ended); dropped",
        )),
        Err(RunError::Fenced { .. }) => Err(ClaimRefused::Fenced(Disposition::Defer(format!(
            "run {run_id} is owned at a later epoch"
        )))),
        Err(e) => Err(ClaimRefused::Retry(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::ledger::{SkipReason, screen};
    use std::collections::BTreeSet;

    fn env(id: &str) -> Envelope {
        Envelope::decode(
            serde_json::json!({"id": id, "type": "task_assigned", "from": "boss", "body": {}})
                .to_string()
                .as_bytes(),
        )
        .expect("an envelope")
    }

    fn delivery(payload: serde_json::Value, delivered: u64) -> Delivery {
        Delivery {
            subscription: "inbox".into(),
            subject: "crewlet.inbox.s".into(),
            payload: bytes::Bytes::from(payload.to_string()),
            delivered,
            msg_id: None,
            seq: 1,
        }
    }

    #[test]
    fn a_batch_sorts_each_delivery_by_its_envelope_and_keeps_its_position() {
        let mail = |id: &str, kind: &str| serde_json::json!({"id": id, "type": kind, "body": {}});
        let ds = vec![
            delivery(mail("t1", "task_assigned"), 2),
            delivery(serde_json::json!({"type": "task_assigned"}), 1),
            delivery(mail("r1", "run_completed"), 1),
            delivery(mail("n1", "status_note"), 1),
            delivery(mail("a1", "tool_approval_answered"), 3),
            delivery(mail("t2", "a2a_message"), 1),
        ];
        let b = sort_batch(&ds);
        let ids = |v: &[Entry]| -> Vec<(usize, String, u64)> {
            v.iter().map(|(i, e, d)| (*i, e.id.clone(), *d)).collect()
        };
        assert_eq!(
            ids(&b.triggers),
            [(0, "t1".to_string(), 2), (5, "t2".to_string(), 1)]
        );
        assert_eq!(ids(&b.resumes), [(2, "r1".to_string(), 1)]);
        assert_eq!(ids(&b.answers), [(4, "a1".to_string(), 3)]);
        assert_eq!(
            b.ignored
                .iter()
                .map(|(i, e)| (*i, e.id.as_str()))
                .collect::<Vec<_>>(),
            [(3, "n1")],
            "mail the ledger does not keep runs no turn"
        );
        assert_eq!(b.poison.len(), 1);
        assert_eq!(b.poison[0].0, 1, "an envelope with no id is poison");
    }

    #[test]
    fn a_partition_runs_one_trigger_per_id_and_acks_what_the_ledger_holds_finished() {
        let part = vec![
            (0, env("a"), 1),
            (1, env("b"), 3),
            (2, env("a"), 2),
            (3, env("c"), 1),
        ];
        let envs: Vec<Envelope> = part.iter().map(|(_, e, _)| e.clone()).collect();
        let done = BTreeSet::from(["c".to_string()]);
        let screened = screen(&envs, &done, &BTreeSet::new());
        assert_eq!(screened.skipped.len(), 1);
        assert_eq!(screened.skipped[0].1, SkipReason::AlreadyDone);
        let p = plan_partition(&part, &screened);
        assert_eq!(
            p.runs,
            [0, 1, 2],
            "both copies of a are answered by the turn"
        );
        assert_eq!(p.acks, [3]);
        let ids: Vec<&str> = p.triggers.iter().map(|t| t.id.as_str()).collect();
        assert_eq!(ids, ["a", "b"]);
        assert_eq!(p.delivered, 3);
    }

    #[test]
    fn a_partition_the_ledger_covers_runs_no_turn() {
        let part = vec![(0, env("a"), 1)];
        let envs = [env("a")];
        let screened = screen(&envs, &BTreeSet::from(["a".to_string()]), &BTreeSet::new());
        let p = plan_partition(&part, &screened);
        assert!(p.triggers.is_empty() && p.runs.is_empty());
        assert_eq!(p.acks, [0]);
    }

    #[test]
    fn a_finished_turn_is_recorded_and_acked_and_its_agent_is_not_aborted() {
        let done = Ending::Done {
            result: serde_json::Value::Null,
            answered: vec![],
        };
        let c = closing(&done, false, "ceo", "t1", false, Duration::ZERO);
        assert!(c.record && c.after_turn && !c.abort && c.keep_claim && !c.guard_breach);
        assert_eq!(c.disposition, Disposition::Ack);
        assert_eq!(c.given_up, None);
    }

    #[test]
    fn a_turn_fenced_before_reaching_outside_is_deferred_unrecorded_and_its_agent_told() {
        let c = closing(&Ending::Fenced, false, "ceo", "t1", false, Duration::ZERO);
        assert!(!c.record && !c.after_turn && c.abort && !c.keep_claim);
        assert_eq!(
            c.disposition,
            Disposition::Defer("seat \"ceo\" moved during turn t1".into())
        );
        let r = closing(&Ending::Fenced, false, "ceo", "t2", true, Duration::ZERO);
        assert_eq!(
            r.disposition,
            Disposition::Defer("seat \"ceo\" moved during resume turn t2".into())
        );
    }

    #[test]
    fn a_turn_that_broke_after_reaching_outside_is_recorded_and_given_up_not_retried() {
        let c = closing(
            &Ending::Broke("x".into()),
            true,
            "ceo",
            "t1",
            false,
            Duration::ZERO,
        );
        assert!(c.record && c.abort && !c.after_turn);
        assert_eq!(c.given_up, Some("broke_after_outside_call"));
        assert_eq!(c.disposition, Disposition::Ack);
        let nak = closing(
            &Ending::Broke("x".into()),
            false,
            "ceo",
            "t1",
            true,
            Duration::ZERO,
        );
        assert!(
            !nak.record && !nak.keep_claim,
            "a resume that proved nothing gives its claim back"
        );
        assert_eq!(nak.disposition, Disposition::Nak);
    }

    #[test]
    fn a_turn_handed_back_waits_the_retry_delay_and_a_zero_delay_is_at_once() {
        let broke = Ending::Broke("the model endpoint is unreachable".into());
        let later = closing(&broke, false, "ceo", "t1", false, Duration::from_secs(4));
        assert_eq!(
            later.disposition,
            Disposition::Retry(Duration::from_secs(4))
        );
        assert_eq!(disposition_name(&later.disposition), "nak");
        let now = closing(&broke, false, "ceo", "t1", false, Duration::ZERO);
        assert_eq!(now.disposition, Disposition::Nak);
        // Only a hand-back waits: a finished or fenced turn is not delayed.
        let done = Ending::Done {
            result: serde_json::Value::Null,
            answered: vec![],
        };
        let secs = Duration::from_secs(4);
        assert_eq!(
            closing(&done, false, "ceo", "t", false, secs).disposition,
            Disposition::Ack
        );
        assert!(matches!(
            closing(&Ending::Fenced, false, "ceo", "t", false, secs).disposition,
            Disposition::Defer(_)
        ));
    }

    #[test]
    fn the_retry_delay_doubles_with_each_delivery_up_to_its_longest() {
        let policy = RetryPolicy {
            first: Duration::from_secs(1),
            max: Duration::from_secs(60),
        };
        let waits: Vec<u64> = (1..=9).map(|d| retry_delay(d, policy).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(retry_delay(0, policy), Duration::from_secs(1));
        assert_eq!(retry_delay(u64::MAX, policy), Duration::from_secs(60));
        let off = RetryPolicy {
            first: Duration::ZERO,
            max: Duration::ZERO,
        };
        assert_eq!(retry_delay(7, off), Duration::ZERO);
    }

    #[test]
    fn a_parked_turn_is_complete_for_now_and_a_panic_is_a_guard_breach() {
        let parked = closing(
            &Ending::Parked {
                on: vec!["r".into()],
            },
            true,
            "ceo",
            "t",
            false,
            Duration::ZERO,
        );
        assert!(parked.record && parked.after_turn && parked.abort);
        let panicked = closing(
            &Ending::Panicked("boom".into()),
            false,
            "ceo",
            "t",
            false,
            Duration::ZERO,
        );
        assert!(panicked.guard_breach && panicked.record);
        assert_eq!(panicked.given_up, Some("panicked"));
    }

    #[test]
    fn a_resume_that_did_not_win_its_claim_is_dropped_deferred_or_retried() {
        assert_eq!(
            after_resume_claim(Err(RunError::NotFound("r1".into())), false, "r1"),
            Err(ClaimRefused::Dropped(
                "a completion for a run with no record (ended); dropped"
            ))
        );
        assert!(matches!(
            after_resume_claim(Err(RunError::Fenced { record: 9, writer: 3 }), false, "r1"),
            Err(ClaimRefused::Fenced(Disposition::Defer(w))) if w == "run r1 is owned at a later epoch"
        ));
    }
}
