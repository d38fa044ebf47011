//! Detached runs: work a turn starts that outlives the turn (the
//! `run_detached` tool) — a command run as a supervised child of the node
//! that launched it, whose completion comes back to whichever node holds
//! the seat by then.
//!
//! A run's record lives in the coordination store (`crewlet_runs`, key
//! `run:{seat}:{run id}`): who owns it and under which epoch
//! (`owner_epoch`), which process launched it, its state and result. Every
//! mutation a seat's holder makes to a live record is a compare-and-set
//! refused when the record's `owner_epoch` outranks the writer's epoch
//! ([`may_write`]), so a zombie's late write bounces; the launcher's one
//! write, the answer, is fenced on the launcher instead
//! ([`Runs::record_answer`]). When the command finishes, its launcher
//! records the answer (`finished`, with the result) in the record, then
//! publishes the completion on the seat's control subject
//! (`crewlet.agent.{handle}.control`), retrying each until it lands; the
//! holder's control subscription resumes the run with a new turn, and the
//! resume claims the record at most once per epoch (`resuming`), settling
//! it when its turn settles; a claim made at an earlier epoch that never
//! settled (its holder died mid-resume) is taken over by the seat's holder
//! ([`resume_claim`]). A recorded answer outlives its launcher: the seat's
//! next holder resumes it. The [`Supervisor`] owns the
//! children this node launched, and kills one whose record was ended or
//! deleted.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;
use tokio_util::sync::CancellationToken;

use crate::coord::{KvError, Revision, StateBucket, Store};
use crate::queue::{Queue, control_subject};

/// How much of a run's stdout and stderr its result keeps (the tail).
pub const OUTPUT_KEPT: usize = 8 * 1024;
/// How often a launcher checks that its children's runs are still live.
pub const WATCH_EVERY: Duration = Duration::from_secs(1);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    Running,
    /// Parked on a question (an answer resumes it).
    Parked,
    /// The answer is recorded (and, with `resumed`, its resume settled).
    Finished,
    /// A resume claimed the answer and its turn has not settled: the
    /// claimer is the record's `owner` at `owner_epoch`. A holder at a
    /// later epoch takes an unsettled claim over ([`resume_claim`]) — its
    /// claimer lost the seat (a crash, say) before the resume settled.
    Resuming,
    Failed,
    /// Ended on purpose (its seat was removed).
    Ended,
}

impl RunState {
    pub fn is_live(self) -> bool {
        matches!(self, RunState::Running | RunState::Parked)
    }
}

/// What a run's command did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunResult {
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A run's record in `crewlet_runs`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    pub run_id: String,
    pub seat: String,
    /// The incarnation that owns the run now (the seat's holder).
    pub owner: String,
    pub owner_epoch: u64,
    /// The incarnation whose child runs the command, and its node.
    pub launcher: String,
    pub launcher_node: String,
    pub state: RunState,
    pub argv: Vec<String>,
    pub work_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<RunResult>,
    /// A resume has claimed the result (the at-most-once flip).
    #[serde(default)]
    pub resumed: bool,
    pub created_at: String,
    pub updated_at: String,
}

/// Pure: may a writer at `writer_epoch` change a record owned at
/// `record_epoch`? Never when the record's epoch outranks the writer's.
pub fn may_write(record_epoch: u64, writer_epoch: u64) -> bool {
    writer_epoch >= record_epoch
}

/// How a resume at some epoch may claim a run's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// Nobody claimed it (or the claim was given back).
    Fresh,
    /// A resume claimed it at `from_epoch` and never settled: its claimer
    /// lost the seat, and the resume is run again here.
    TakenOver { from_epoch: u64 },
}

/// Pure: may a resume at `epoch` claim `r`'s answer? Never an ended run,
/// never a settled resume (`finished` and `resumed`: a completion
/// delivered twice resumes once), and never a claim made at this epoch or
/// a later one (this holder's own resume, or a successor's). A claim made
/// at an earlier epoch whose resume never settled is taken over: the
/// claimer no longer holds the seat at that epoch, so its resume turn can
/// neither go on (the in-turn fence) nor settle (its writes are fenced).
pub fn resume_claim(r: &RunRecord, epoch: u64) -> Option<Claim> {
    match r.state {
        RunState::Ended => None,
        RunState::Resuming if r.resumed => (r.owner_epoch < epoch).then_some(Claim::TakenOver {
            from_epoch: r.owner_epoch,
        }),
        _ if r.resumed => None,
        _ => Some(Claim::Fresh),
    }
}

/// Pure: does `r` hold a resume claim made before `epoch` that never
/// settled? (What recovery on acquire resumes again.)
pub fn unsettled_before(r: &RunRecord, epoch: u64) -> bool {
    r.state == RunState::Resuming && r.resumed && r.owner_epoch < epoch
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("run {0} has no record")]
    NotFound(String),
    #[error("refused: the run is owned at epoch {record}, the writer is at epoch {writer}")]
    Fenced { record: u64, writer: u64 },
    #[error("the run record kept changing under the write")]
    Contended,
    #[error("the run store: {0}")]
    Store(String),
}

/// Why a detached run's command did not start (its record is failed with
/// this, and the call answers it).
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("run_detached: `argv` is empty")]
    EmptyArgv,
    #[error("run_detached: cannot make the seat's working directory: {0}")]
    WorkDir(std::io::Error),
    #[error("run_detached: cannot start {program:?}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
}

/// What the launcher's record of its run's answer came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The record holds the answer, waiting for its resume.
    Recorded,
    /// Nothing waits for it: the record is gone, ended, already resumed,
    /// or another launcher's.
    Unwanted,
}

fn key(seat: &str, run_id: &str) -> String {
    format!("run:{seat}:{run_id}")
}

/// The run records in the coordination store.
#[derive(Clone)]
pub struct Runs {
    store: Arc<dyn Store>,
}

impl Runs {
    pub fn new(store: Arc<dyn Store>) -> Runs {
        Runs { store }
    }

    /// Create a record. `false` when one with that id exists (the same
    /// work started it before): nothing is launched twice.
    pub async fn create(&self, r: &RunRecord) -> Result<bool, RunError> {
        let v = Bytes::from(serde_json::to_vec(r).unwrap_or_default());
        match self
            .store
            .create(StateBucket::Runs, &key(&r.seat, &r.run_id), v)
            .await
        {
            Ok(_) => Ok(true),
            Err(KvError::AlreadyExists) => Ok(false),
            Err(e) => Err(RunError::Store(e.to_string())),
        }
    }

    pub async fn get(
        &self,
        seat: &str,
        run_id: &str,
    ) -> Result<Option<(RunRecord, Revision)>, RunError> {
        let e = self
            .store
            .get(StateBucket::Runs, &key(seat, run_id))
            .await
            .map_err(|e| RunError::Store(e.to_string()))?;
        Ok(e.and_then(|e| decoded(&key(seat, run_id), &e.value).map(|r| (r, e.revision))))
    }

    /// Every run record of `seat` (a record that cannot be decoded is left
    /// where it is, for a person to inspect, and logged).
    pub async fn list(&self, seat: &str) -> Result<Vec<(RunRecord, Revision)>, RunError> {
        let es = self
            .store
            .entries(StateBucket::Runs, &format!("run:{seat}:"))
            .await
            .map_err(|e| RunError::Store(e.to_string()))?;
        Ok(es
            .into_iter()
            .filter_map(|e| {
                decoded(&e.key, &e.value)
                    .filter(|r| r.seat == seat)
                    .map(|r| (r, e.revision))
            })
            .collect())
    }

    /// Change a record as a writer at `epoch`: `f` edits it (returning
    /// false leaves it as it is). Refused when the record's epoch
    /// outranks the writer's; retried on a concurrent change.
    pub async fn mutate(
        &self,
        seat: &str,
        run_id: &str,
        epoch: u64,
        f: impl Fn(&mut RunRecord) -> bool,
    ) -> Result<RunRecord, RunError> {
        self.cas(seat, run_id, |r| {
            if !may_write(r.owner_epoch, epoch) {
                return Err(RunError::Fenced {
                    record: r.owner_epoch,
                    writer: epoch,
                });
            }
            Ok(f(r))
        })
        .await
    }

    /// The launcher records what its child did: the record becomes
    /// `finished` with `result`, waiting for a resume. Written as the
    /// launcher, not as an owner: it is refused unless `launcher` launched
    /// this record's run, and it never touches `owner` or `owner_epoch`
    /// (the owner's fence stays whole; the resume is what a holder's epoch
    /// fences). A record a new holder failed as `launcher_lost` takes the
    /// answer all the same — the launcher was not lost after all.
    pub async fn record_answer(
        &self,
        seat: &str,
        run_id: &str,
        launcher: &str,
        result: &RunResult,
    ) -> Result<Answer, RunError> {
        let answer = std::sync::Mutex::new(Answer::Recorded);
        let set = |a: Answer| *answer.lock().unwrap_or_else(|e| e.into_inner()) = a;
        let r = self
            .cas(seat, run_id, |r| {
                if r.launcher != launcher || r.state == RunState::Ended || r.resumed {
                    set(Answer::Unwanted);
                    return Ok(false);
                }
                set(Answer::Recorded);
                if r.state == RunState::Finished {
                    // This launcher's earlier write landed; its reply did not.
                    return Ok(false);
                }
                r.state = RunState::Finished;
                r.result = Some(result.clone());
                Ok(true)
            })
            .await;
        match r {
            Ok(_) => Ok(*answer.lock().unwrap_or_else(|e| e.into_inner())),
            Err(RunError::NotFound(_)) => Ok(Answer::Unwanted),
            Err(e) => Err(e),
        }
    }

    /// The compare-and-set under every change: `f` checks the record (an
    /// `Err` refuses the write) and edits it (`false` leaves it as it is).
    async fn cas(
        &self,
        seat: &str,
        run_id: &str,
        f: impl Fn(&mut RunRecord) -> Result<bool, RunError>,
    ) -> Result<RunRecord, RunError> {
        for _ in 0..8 {
            let Some((mut r, rev)) = self.get(seat, run_id).await? else {
                return Err(RunError::NotFound(run_id.to_string()));
            };
            if !f(&mut r)? {
                return Ok(r);
            }
            r.updated_at = crate::clock::now_rfc3339();
            let v = Bytes::from(serde_json::to_vec(&r).unwrap_or_default());
            match self
                .store
                .update(StateBucket::Runs, &key(seat, run_id), v, rev)
                .await
            {
                Ok(_) => return Ok(r),
                Err(KvError::WrongRevision) => continue,
                Err(e) => return Err(RunError::Store(e.to_string())),
            }
        }
        Err(RunError::Contended)
    }

    /// Delete a record as a writer at `epoch` (fenced like a mutation).
    pub async fn delete(&self, seat: &str, run_id: &str, epoch: u64) -> Result<(), RunError> {
        for _ in 0..8 {
            let Some((r, rev)) = self.get(seat, run_id).await? else {
                return Ok(());
            };
            if !may_write(r.owner_epoch, epoch) {
                return Err(RunError::Fenced {
                    record: r.owner_epoch,
                    writer: epoch,
                });
            }
            match self
                .store
                .delete(StateBucket::Runs, &key(seat, run_id), rev)
                .await
            {
                Ok(()) => return Ok(()),
                Err(KvError::WrongRevision) => continue,
                Err(e) => return Err(RunError::Store(e.to_string())),
            }
        }
        Err(RunError::Contended)
    }
}

/// What the holder is told on the seat's control subject.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ControlMessage {
    /// The pause record changed: read it and take or drop the hold.
    PauseChanged,
    /// Stop the running turn at its next round boundary.
    Stop { by: String, at: String },
    /// A detached run's command finished (published by its launcher):
    /// the holder resumes it.
    RunCompleted(RunCompletion),
    /// A person answered one of the seat's approvals (the record holds
    /// the answer): the holder resumes it.
    ApprovalAnswered { approval_id: String },
}

/// The completion a launcher publishes on the seat's control subject.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunCompletion {
    pub run_id: String,
    pub result: RunResult,
}

/// The first wait before a launcher tries again to record an answer or
/// publish a completion; it doubles up to [`RETRY_MAX`].
pub const RETRY_FIRST: Duration = Duration::from_millis(200);
/// The longest wait between a launcher's tries.
pub const RETRY_MAX: Duration = Duration::from_secs(30);

/// Wait out one backoff step; `false` when the supervisor stops first.
async fn backoff(stop: &CancellationToken, wait: &mut Duration) -> bool {
    tokio::select! {
        _ = stop.cancelled() => false,
        _ = tokio::time::sleep(*wait) => {
            *wait = (*wait * 2).min(RETRY_MAX);
            true
        }
    }
}

/// What a launcher does with its child's result: record the answer in the
/// run's record first (so a holder that never sees the completion — the
/// launcher died before it was resumed — still finds the answer and
/// resumes it), then publish the completion on the seat's control subject
/// (deduped by id, so a publish retried after a lost reply lands once).
/// Each step is retried with backoff until it lands; only stopping the
/// supervisor ends the retries, and a recorded answer then waits for the
/// seat's next holder.
async fn deliver(
    runs: &Runs,
    queue: &dyn Queue,
    stop: &CancellationToken,
    seat: &str,
    run_id: &str,
    launcher: &str,
    result: RunResult,
) {
    let mut wait = RETRY_FIRST;
    loop {
        match runs.record_answer(seat, run_id, launcher, &result).await {
            Ok(Answer::Recorded) => break,
            Ok(Answer::Unwanted) => {
                tracing::info!(
                    seat,
                    run_id,
                    "a run finished that nothing waits for (its record is gone, ended or resumed); its completion is not published"
                );
                return;
            }
            Err(e) => {
                tracing::warn!(seat, run_id, error = %e, retry_in = ?wait, "cannot record a run's answer; trying again");
            }
        }
        if !backoff(stop, &mut wait).await {
            tracing::error!(seat, run_id, "stopping with a run's answer unrecorded");
            return;
        }
    }
    let msg = ControlMessage::RunCompleted(RunCompletion {
        run_id: run_id.to_string(),
        result,
    });
    let body = Bytes::from(serde_json::to_vec(&msg).unwrap_or_default());
    let mut wait = RETRY_FIRST;
    loop {
        match queue
            .publish(
                &control_subject(seat),
                Some(&format!("run-done-{run_id}")),
                body.clone(),
            )
            .await
        {
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(seat, run_id, error = %e, retry_in = ?wait, "cannot publish a run's completion; trying again");
            }
        }
        if !backoff(stop, &mut wait).await {
            tracing::warn!(
                seat,
                run_id,
                "stopping before a run's completion was published; its answer is recorded, so the seat's next holder resumes it"
            );
            return;
        }
    }
}

/// The children this node launched.
pub struct Supervisor {
    runs: Runs,
    queue: Arc<dyn Queue>,
    children: Arc<Mutex<HashMap<String, CancellationToken>>>,
    tasks: crate::tasks::Tasks,
    /// Where and as whom the children run.
    confinement: crate::config::Confinement,
}

/// Read `r` to its end keeping only about the last `keep` bytes (never
/// more than twice that in memory), so a child that prints without end
/// neither blocks on a full pipe nor fills the node's memory.
async fn read_tail<R: tokio::io::AsyncRead + Unpin>(r: &mut R, keep: usize) -> Vec<u8> {
    let mut kept = Vec::with_capacity(keep.min(64 * 1024));
    let mut buf = [0u8; 8192];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                kept.extend_from_slice(&buf[..n]);
                if kept.len() > 2 * keep {
                    kept.drain(..kept.len() - keep);
                }
            }
        }
    }
    kept
}

fn tail(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    if s.len() <= OUTPUT_KEPT {
        return s.into_owned();
    }
    let mut start = s.len() - OUTPUT_KEPT;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    s[start..].to_string()
}

impl Supervisor {
    pub fn new(runs: Runs, queue: Arc<dyn Queue>) -> Supervisor {
        Supervisor {
            runs,
            queue,
            children: Arc::new(Mutex::new(HashMap::new())),
            tasks: crate::tasks::Tasks::new(),
            confinement: Default::default(),
        }
    }

    /// Run each child as `c` says (its seat's own directory, the agent
    /// user).
    pub fn confined(mut self, c: crate::config::Confinement) -> Supervisor {
        self.confinement = c;
        self
    }

    /// Runs whose child is alive here.
    pub fn running(&self) -> usize {
        self.children
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// Is `run_id`'s child alive here?
    pub fn is_running(&self, run_id: &str) -> bool {
        self.children
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(run_id)
    }

    /// Start `r`'s command. When it finishes, its answer is recorded in the
    /// run's record and then its completion is published on the seat's
    /// control subject, each retried until it lands (see [`deliver`]); a
    /// record that is ended or deleted meanwhile kills it.
    pub fn launch(&self, r: &RunRecord, timeout: Duration) -> Result<(), LaunchError> {
        let (program, args) = r.argv.split_first().ok_or(LaunchError::EmptyArgv)?;
        let env =
            crate::config::base_child_env(&r.seat, &r.launcher_node, &|k| std::env::var(k).ok());
        let mut command = super::children::clean_command(program, args, env);
        super::children::confine(&mut command, &self.confinement, &r.seat)
            .map_err(LaunchError::WorkDir)?;
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| LaunchError::Spawn {
                program: program.clone(),
                source,
            })?;
        let kill = self.tasks.token().child_token();
        self.children
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(r.run_id.clone(), kill.clone());
        let (runs, queue, children) =
            (self.runs.clone(), self.queue.clone(), self.children.clone());
        let (seat, run_id, launcher) = (r.seat.clone(), r.run_id.clone(), r.launcher.clone());
        let stop = self.tasks.token();
        self.tasks.spawn_owned("detached run", move |_| async move {
            let mut out = child.stdout.take();
            let mut err = child.stderr.take();
            let read_out = async {
                match out.as_mut() {
                    Some(o) => read_tail(o, OUTPUT_KEPT).await,
                    None => Vec::new(),
                }
            };
            let read_err = async {
                match err.as_mut() {
                    Some(e) => read_tail(e, OUTPUT_KEPT).await,
                    None => Vec::new(),
                }
            };
            let watch = async {
                loop {
                    tokio::time::sleep(WATCH_EVERY).await;
                    // A run failed as `launcher_lost` while its launcher
                    // lives on is left to finish: its answer is recorded
                    // and resumed all the same.
                    match runs.get(&seat, &run_id).await {
                        Ok(Some((r, _))) if r.state != RunState::Ended => {}
                        Ok(_) => return "its record was ended",
                        Err(_) => {}
                    }
                }
            };
            let outcome = tokio::select! {
                r = async { tokio::join!(child.wait(), read_out, read_err) } => Some(r),
                _ = tokio::time::sleep(timeout) => None,
                why = watch => {
                    tracing::info!(seat = %seat, run_id = %run_id, "{why}; killing the run's child");
                    let _ = super::children::kill_group(&mut child).await;
                    children.lock().unwrap_or_else(|e| e.into_inner()).remove(&run_id);
                    return;
                }
                _ = kill.cancelled() => {
                    let _ = super::children::kill_group(&mut child).await;
                    children.lock().unwrap_or_else(|e| e.into_inner()).remove(&run_id);
                    return;
                }
            };
            let result = match outcome {
                Some((status, o, e)) => RunResult {
                    exit_code: status.as_ref().ok().and_then(|s| s.code()),
                    timed_out: false,
                    stdout: tail(&o),
                    stderr: tail(&e),
                    error: status.err().map(|e| e.to_string()),
                },
                None => {
                    let _ = super::children::kill_group(&mut child).await;
                    RunResult {
                        timed_out: true,
                        error: Some(format!("did not finish within {timeout:?}")),
                        ..RunResult::default()
                    }
                }
            };
            children
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&run_id);
            deliver(&runs, &*queue, &stop, &seat, &run_id, &launcher, result).await;
        });
        Ok(())
    }

    /// Kill `run_id`'s child if it runs here.
    pub fn kill(&self, run_id: &str) -> bool {
        match self
            .children
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(run_id)
        {
            Some(t) => {
                t.cancel();
                true
            }
            None => false,
        }
    }

    /// Kill every child and wait for their tasks (what stopping the node,
    /// or a crash, does to them).
    pub async fn shutdown(&self) {
        self.tasks.shutdown().await;
    }
}

/// A stored run record, or `None` — logged with its key — when it cannot
/// be decoded (written by a newer build, or damaged): it is never
/// adopted, failed or deleted by this build.
fn decoded(key: &str, value: &[u8]) -> Option<RunRecord> {
    match serde_json::from_slice(value) {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::error!(key, error = %e, "a run record cannot be decoded; it is left in crewlet_runs untouched");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_childs_endless_output_is_read_to_its_end_keeping_only_the_tail() {
        let big: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
        let mut r = &big[..];
        let kept = read_tail(&mut r, OUTPUT_KEPT).await;
        assert!(kept.len() <= 2 * OUTPUT_KEPT, "kept {} bytes", kept.len());
        assert!(kept.ends_with(&big[big.len() - OUTPUT_KEPT..]));
    }

    #[test]
    fn a_writer_below_the_records_epoch_is_refused() {
        assert!(may_write(3, 3));
        assert!(may_write(3, 4));
        assert!(!may_write(4, 3));
    }

    fn rec(state: RunState, resumed: bool, owner_epoch: u64) -> RunRecord {
        RunRecord {
            run_id: "r".into(),
            seat: "s".into(),
            owner: "a:1".into(),
            owner_epoch,
            launcher: "a:1".into(),
            launcher_node: "a".into(),
            state,
            argv: vec!["true".into()],
            work_key: None,
            result: None,
            resumed,
            created_at: String::new(),
            updated_at: String::new(),
        }
    }

    #[test]
    fn a_resume_claims_once_and_takes_over_only_an_unsettled_claim_of_an_earlier_epoch() {
        use RunState::*;
        assert_eq!(
            resume_claim(&rec(Finished, false, 2), 2),
            Some(Claim::Fresh)
        );
        assert_eq!(resume_claim(&rec(Failed, false, 2), 3), Some(Claim::Fresh));
        assert_eq!(resume_claim(&rec(Running, false, 2), 2), Some(Claim::Fresh));
        assert_eq!(
            resume_claim(&rec(Finished, true, 2), 3),
            None,
            "a settled resume is never run again"
        );
        assert_eq!(resume_claim(&rec(Ended, false, 2), 3), None);
        assert_eq!(
            resume_claim(&rec(Resuming, true, 2), 2),
            None,
            "this holder's own claim"
        );
        assert_eq!(
            resume_claim(&rec(Resuming, true, 2), 3),
            Some(Claim::TakenOver { from_epoch: 2 })
        );
        assert!(unsettled_before(&rec(Resuming, true, 2), 3));
        assert!(!unsettled_before(&rec(Resuming, true, 3), 3));
        assert!(!unsettled_before(&rec(Finished, true, 2), 3));
    }

    #[test]
    fn the_output_kept_is_the_tail() {
        let long = "x".repeat(OUTPUT_KEPT + 10) + "end";
        let t = tail(long.as_bytes());
        assert_eq!(t.len(), OUTPUT_KEPT);
        assert!(t.ends_with("end"));
        assert_eq!(tail(b"short"), "short");
    }
}
