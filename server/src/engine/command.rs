//! The command agent: the seat's own child process, speaking JSON lines on
//! its stdin and stdout (docs/agents.md § The command agent).
//!
//! The child is started in the acquire hook and sent SIGTERM in the release
//! hook. Each round writes one line to the child and reads lines until one
//! answers the running turn: a line that is not JSON, or that names another
//! turn (a late answer to a turn that was aborted or abandoned), is logged
//! and skipped. The child's stderr is forwarded to the log line by line.
//!
//! The pipes and the child handle sit behind separate locks (always taken
//! pipes first) so the release hook never waits for a round in flight.
//! Reading and writing keep their progress in [`Pipes`], so a round whose
//! future is dropped half-way leaves the agent usable: a half-read line is
//! finished by the next read, and a half-written line is closed by a bare
//! newline before the next message (the child sees one line that is not
//! JSON and skips it).

use std::io;
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout};
use tokio::sync::Mutex;

use super::agent::{Agent, AgentError, Step, ToolCall, ToolResult, TurnInput};
use crate::config::CommandConfig;

/// How long a round that lost the child's pipes waits to reap it, so the
/// error can carry its exit status.
const REAP_WAIT: Duration = Duration::from_millis(500);

/// How long an abort line may take to write (a child that stopped reading
/// its stdin must not hold up the end of a turn).
const ABORT_WRITE_WAIT: Duration = Duration::from_secs(2);

/// The longest piece of a skipped line that is logged.
const LOGGED_LINE_CHARS: usize = 200;

/// The longest line the child may write on stdout: past it the child is
/// killed and the round fails saying so (a child printing without end
/// must not fill the node's memory).
pub const LINE_LIMIT: usize = 4 * 1024 * 1024;

/// The longest stderr line logged whole; the rest of a longer one is
/// dropped, saying how much.
pub const STDERR_LINE_LIMIT: usize = 2000;

/// The engine's ends of the child's stdin and stdout.
struct Pipes {
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// The line being read, kept across dropped rounds.
    partial: Vec<u8>,
    /// A write was cut off mid-line: the next write closes that line first.
    torn: bool,
    /// stdout reached its end or a pipe failed: the child is lost.
    closed: bool,
}

/// Why a round ended without an answer from the child.
enum Failure {
    /// The child sent an error, or an answer that does not decode.
    Agent(AgentError),
    /// stdout reached its end.
    Eof,
    /// Writing to stdin or reading stdout failed.
    Io(io::Error),
    /// A stdout line ran past [`LINE_LIMIT`].
    TooLong,
}

#[derive(Deserialize)]
struct CallsAnswer {
    calls: Vec<ToolCall>,
}

#[derive(Deserialize)]
struct DoneAnswer {
    #[serde(default)]
    result: Value,
    #[serde(default)]
    answered: Vec<String>,
}

#[derive(Deserialize)]
struct ErrorAnswer {
    message: String,
}

/// A seat's child process, run as its [`Agent`].
pub struct CommandAgent {
    seat: String,
    node: String,
    cfg: CommandConfig,
    pipes: Mutex<Option<Pipes>>,
    child: Mutex<Option<Child>>,
    /// The held child's pid; 0 when no child is held.
    pid: AtomicU32,
    /// Where and as whom the child runs.
    confinement: crate::config::Confinement,
}

impl CommandAgent {
    /// The agent of `seat` on `node`. Nothing runs until [`Agent::start`].
    pub fn new(seat: &str, node: &str, cfg: &CommandConfig) -> CommandAgent {
        CommandAgent {
            seat: seat.to_string(),
            node: node.to_string(),
            cfg: cfg.clone(),
            pipes: Mutex::new(None),
            child: Mutex::new(None),
            pid: AtomicU32::new(0),
            confinement: Default::default(),
        }
    }

    /// Run the child as `c` says (the seat's own directory, the agent
    /// user).
    pub fn confined(mut self, c: crate::config::Confinement) -> CommandAgent {
        self.confinement = c;
        self
    }

    /// The pid of the child process this agent holds: running, or not yet
    /// reaped after a failed stop. `None` before the first start and once
    /// the child has been reaped.
    pub fn pid(&self) -> Option<u32> {
        match self.pid.load(Ordering::SeqCst) {
            0 => None,
            pid => Some(pid),
        }
    }

    fn program(&self) -> String {
        self.cfg.argv.join(" ")
    }

    fn forget_child(&self, child: &mut Option<Child>) {
        *child = None;
        self.pid.store(0, Ordering::SeqCst);
    }

    /// Is the held child still running? A child found exited is reaped.
    fn running(&self, child: &mut Option<Child>) -> bool {
        let Some(c) = child.as_mut() else {
            return false;
        };
        match c.try_wait() {
            Ok(None) => true,
            Ok(Some(status)) => {
                tracing::warn!(seat = %self.seat, "the agent process exited ({status})");
                self.forget_child(child);
                false
            }
            Err(e) => {
                tracing::warn!(seat = %self.seat, error = %e, "cannot poll the agent process");
                true
            }
        }
    }

    /// Start the child. The caller holds both locks; a child still held
    /// (one that closed its stdout but did not exit) is dropped, which
    /// kills it.
    fn spawn(
        &self,
        pipes: &mut Option<Pipes>,
        child: &mut Option<Child>,
    ) -> Result<(), AgentError> {
        let Some((program, args)) = self.cfg.argv.split_first() else {
            return Err(AgentError::new(
                "the command agent has no program to run (argv is empty)",
            ));
        };
        let env = self
            .cfg
            .child_env(&self.seat, &self.node, &|k| std::env::var(k).ok());
        let mut command = super::children::clean_command(program, args, env);
        super::children::confine(&mut command, &self.confinement, &self.seat)
            .map_err(|e| AgentError(format!("cannot make the seat's working directory: {e}")))?;
        let mut spawned = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| AgentError(format!("cannot start `{}`: {e}", self.program())))?;
        let (Some(stdin), Some(stdout)) = (spawned.stdin.take(), spawned.stdout.take()) else {
            return Err(AgentError(format!(
                "cannot start `{}`: its stdin and stdout were not piped",
                self.program()
            )));
        };
        if let Some(stderr) = spawned.stderr.take() {
            crate::tasks::spawn_held("agent stderr", forward_stderr(self.seat.clone(), stderr));
        }
        if let Some(old) = child.as_ref() {
            tracing::warn!(
                seat = %self.seat,
                pid = old.id(),
                "the old agent process closed its stdout but is still running; it is replaced"
            );
        }
        let pid = spawned.id().unwrap_or(0);
        *child = Some(spawned);
        self.pid.store(pid, Ordering::SeqCst);
        *pipes = Some(Pipes {
            stdin,
            stdout: BufReader::new(stdout),
            partial: Vec::new(),
            torn: false,
            closed: false,
        });
        tracing::info!(seat = %self.seat, pid, program = %self.program(), "agent process started");
        Ok(())
    }

    /// Write `message`, then read until a line answers `turn_id`.
    async fn exchange(
        &self,
        p: &mut Pipes,
        message: &Value,
        turn_id: &str,
    ) -> Result<Step, Failure> {
        write_line(p, message).await.map_err(Failure::Io)?;
        loop {
            let line = match read_line(p, LINE_LIMIT).await {
                Ok(Line::Whole(line)) => line,
                Ok(Line::End) => return Err(Failure::Eof),
                Ok(Line::TooLong) => return Err(Failure::TooLong),
                Err(e) => return Err(Failure::Io(e)),
            };
            if let Some(answer) = self.answer(&line, turn_id) {
                return answer.map_err(Failure::Agent);
            }
        }
    }

    /// What one line of stdout says about `turn_id`: `None` when it says
    /// nothing (skipped).
    fn answer(&self, raw: &[u8], turn_id: &str) -> Option<Result<Step, AgentError>> {
        let text = String::from_utf8_lossy(raw);
        let text = text.trim();
        if text.is_empty() {
            return None;
        }
        let v: Value = match serde_json::from_str(text) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(
                    seat = %self.seat,
                    line = %clip(text),
                    "agent stdout: not a JSON line, skipped ({e})"
                );
                return None;
            }
        };
        let answers = v.get("turn_id").and_then(Value::as_str);
        if answers != Some(turn_id) {
            tracing::warn!(
                seat = %self.seat,
                turn_id,
                answers = answers.unwrap_or("(none)"),
                "agent stdout: an answer for another turn, skipped"
            );
            return None;
        }
        let kind = v
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let decoded = match kind.as_str() {
            "calls" => serde_json::from_value::<CallsAnswer>(v).map(|a| Ok(Step::Calls(a.calls))),
            "done" => serde_json::from_value::<DoneAnswer>(v).map(|a| {
                Ok(Step::Done {
                    result: a.result,
                    answered: a.answered,
                })
            }),
            "error" => serde_json::from_value::<ErrorAnswer>(v).map(|a| {
                Err(AgentError(format!(
                    "the agent process reported an error: {}",
                    a.message
                )))
            }),
            _ => {
                tracing::warn!(
                    seat = %self.seat,
                    turn_id,
                    kind = %kind,
                    "agent stdout: an answer of unknown type, skipped"
                );
                return None;
            }
        };
        Some(decoded.unwrap_or_else(|e| {
            Err(AgentError(format!(
                "the agent process's `{kind}` answer to turn {turn_id} does not decode: {e}"
            )))
        }))
    }

    /// The child wrote a stdout line past [`LINE_LIMIT`] `during` a round:
    /// it is killed with its group and the round fails saying why.
    async fn overran(&self, p: &mut Pipes, during: &str) -> AgentError {
        p.closed = true;
        let mut child = self.child.lock().await;
        if let Some(c) = child.as_mut() {
            if let Err(e) = super::children::kill_group(c).await {
                tracing::warn!(seat = %self.seat, error = %e, "cannot kill the agent process that overran its line limit");
            }
            self.forget_child(&mut child);
        }
        tracing::warn!(seat = %self.seat, limit = LINE_LIMIT, "the agent process wrote a stdout line past the limit; it was killed");
        AgentError(format!(
            "the agent process wrote a line of more than {LINE_LIMIT} bytes on stdout {during}; it was killed"
        ))
    }

    /// The child's pipes were lost `during` a round: mark them closed and
    /// say why, with the exit status when the child can be reaped.
    async fn lost(&self, p: &mut Pipes, during: &str, cause: Option<io::Error>) -> AgentError {
        p.closed = true;
        let mut child = self.child.lock().await;
        let status = match child.as_mut() {
            Some(c) => tokio::time::timeout(REAP_WAIT, c.wait())
                .await
                .ok()
                .and_then(Result::ok),
            None => None,
        };
        if let Some(status) = status {
            self.forget_child(&mut child);
            return AgentError(format!("the agent process exited ({status}) {during}"));
        }
        let pid = self
            .pid()
            .map(|p| format!(" (pid {p})"))
            .unwrap_or_default();
        match cause {
            Some(e) => AgentError(format!(
                "the agent process{pid} lost its pipes {during}: {e}"
            )),
            None => AgentError(format!(
                "the agent process{pid} closed its stdout {during} but has not exited"
            )),
        }
    }
}

#[async_trait::async_trait]
impl Agent for CommandAgent {
    async fn start(&self) -> Result<(), AgentError> {
        let mut pipes = self.pipes.lock().await;
        let mut child = self.child.lock().await;
        let open = pipes.as_ref().is_some_and(|p| !p.closed);
        if self.running(&mut child) && open {
            return Ok(());
        }
        self.spawn(&mut pipes, &mut child)
    }

    async fn round(
        &self,
        turn: &TurnInput,
        round: u32,
        results: Vec<ToolResult>,
    ) -> Result<Step, AgentError> {
        let mut pipes = self.pipes.lock().await;
        if round <= 1 {
            let mut child = self.child.lock().await;
            let open = pipes.as_ref().is_some_and(|p| !p.closed);
            if !(self.running(&mut child) && open) {
                tracing::warn!(
                    seat = %self.seat,
                    turn_id = %turn.turn_id,
                    "the agent process is not running; it is started again"
                );
                self.spawn(&mut pipes, &mut child)?;
            }
        }
        let Some(p) = pipes.as_mut().filter(|p| !p.closed) else {
            return Err(AgentError(format!(
                "the agent process is not running (it was lost before round {round} of turn {})",
                turn.turn_id
            )));
        };
        let message = if round <= 1 {
            json!({ "type": "turn", "turn": turn })
        } else {
            json!({
                "type": "results",
                "turn_id": turn.turn_id,
                "round": round,
                "results": results,
            })
        };
        let limit = Duration::from_secs(self.cfg.round_timeout_seconds);
        let during = format!("before it answered round {round} of turn {}", turn.turn_id);
        match tokio::time::timeout(limit, self.exchange(p, &message, &turn.turn_id)).await {
            Ok(Ok(step)) => Ok(step),
            Ok(Err(Failure::Agent(e))) => Err(e),
            Ok(Err(Failure::Eof)) => Err(self.lost(p, &during, None).await),
            Ok(Err(Failure::Io(e))) => Err(self.lost(p, &during, Some(e)).await),
            Ok(Err(Failure::TooLong)) => Err(self.overran(p, &during).await),
            Err(_) => Err(AgentError(format!(
                "the agent process did not answer round {round} of turn {} within {}s (round_timeout_seconds)",
                turn.turn_id, self.cfg.round_timeout_seconds
            ))),
        }
    }

    async fn abort(&self, turn_id: &str, reason: &str) {
        let mut pipes = self.pipes.lock().await;
        let Some(p) = pipes.as_mut().filter(|p| !p.closed) else {
            return;
        };
        let message = json!({ "type": "abort", "turn_id": turn_id, "reason": reason });
        match tokio::time::timeout(ABORT_WRITE_WAIT, write_line(p, &message)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::debug!(seat = %self.seat, turn_id, error = %e, "cannot send the abort line");
            }
            Err(_) => {
                tracing::debug!(seat = %self.seat, turn_id, "the abort line did not go out in time");
            }
        }
    }

    async fn stop(&self) -> Result<(), AgentError> {
        let mut child = self.child.lock().await;
        let Some(c) = child.as_mut() else {
            return Ok(());
        };
        if let Ok(Some(status)) = c.try_wait() {
            tracing::info!(seat = %self.seat, "agent process reaped ({status})");
            self.forget_child(&mut child);
            self.drop_pipes();
            return Ok(());
        }
        let Some(pid) = c.id() else {
            self.forget_child(&mut child);
            self.drop_pipes();
            return Ok(());
        };
        let wait = Duration::from_millis(self.cfg.stop_wait_ms);
        match super::children::terminate(c, wait).await {
            Ok(stopped) => {
                let how = if stopped.killed {
                    format!(
                        "killed with its group after {}ms of SIGTERM",
                        self.cfg.stop_wait_ms
                    )
                } else {
                    "stopped".to_string()
                };
                tracing::info!(seat = %self.seat, pid, "agent process {how} ({})", stopped.status);
                self.forget_child(&mut child);
                self.drop_pipes();
                Ok(())
            }
            Err(super::children::NotStopped::Wait(e)) => Err(AgentError(format!(
                "cannot wait for the agent process (pid {pid}): {e}"
            ))),
            Err(super::children::NotStopped::StillRunning) => Err(AgentError(format!(
                "the agent process (pid {pid}) did not exit within {}ms of SIGTERM nor {}ms of SIGKILL",
                self.cfg.stop_wait_ms,
                super::children::KILL_WAIT.as_millis()
            ))),
        }
    }
}

impl CommandAgent {
    /// Let go of a stopped child's pipes, unless a round holds them (the
    /// next round 1 replaces them anyway).
    fn drop_pipes(&self) {
        if let Ok(mut pipes) = self.pipes.try_lock() {
            *pipes = None;
        }
    }
}

/// Write one JSON line and flush it.
async fn write_line(p: &mut Pipes, message: &Value) -> io::Result<()> {
    let mut bytes = Vec::new();
    if p.torn {
        bytes.push(b'\n');
    }
    serde_json::to_writer(&mut bytes, message)?;
    bytes.push(b'\n');
    p.torn = true;
    p.stdin.write_all(&bytes).await?;
    p.stdin.flush().await?;
    p.torn = false;
    Ok(())
}

/// What one read of a line came to.
enum Line {
    /// A line, without its newline (the last one may have none).
    Whole(Vec<u8>),
    /// The stream ended.
    End,
    /// The line ran past the limit.
    TooLong,
}

/// Read one line of stdout, at most `limit` bytes, keeping what was read
/// in `p.partial` (a dropped round loses nothing).
async fn read_line(p: &mut Pipes, limit: usize) -> io::Result<Line> {
    loop {
        let buf = p.stdout.fill_buf().await?;
        if buf.is_empty() {
            if p.partial.is_empty() {
                return Ok(Line::End);
            }
            return Ok(Line::Whole(std::mem::take(&mut p.partial)));
        }
        let (take, done) = match buf.iter().position(|b| *b == b'\n') {
            Some(i) => (i, true),
            None => (buf.len(), false),
        };
        if p.partial.len() + take > limit {
            return Ok(Line::TooLong);
        }
        p.partial.extend_from_slice(&buf[..take]);
        p.stdout.consume(take + usize::from(done));
        if done {
            return Ok(Line::Whole(std::mem::take(&mut p.partial)));
        }
    }
}

/// Log the child's stderr line by line until the pipe closes: each line
/// at most [`STDERR_LINE_LIMIT`] bytes, the rest of a longer one dropped
/// (and counted).
async fn forward_stderr(seat: String, stderr: ChildStderr) {
    let mut reader = BufReader::new(stderr);
    let mut line = Vec::new();
    let mut dropped = 0usize;
    while let Ok(buf) = reader.fill_buf().await {
        if buf.is_empty() {
            break;
        }
        let (take, done) = match buf.iter().position(|b| *b == b'\n') {
            Some(i) => (i, true),
            None => (buf.len(), false),
        };
        let room = STDERR_LINE_LIMIT.saturating_sub(line.len()).min(take);
        line.extend_from_slice(&buf[..room]);
        dropped += take - room;
        reader.consume(take + usize::from(done));
        if done {
            log_stderr(&seat, &line, dropped);
            line.clear();
            dropped = 0;
        }
    }
    if !line.is_empty() {
        log_stderr(&seat, &line, dropped);
    }
}

fn log_stderr(seat: &str, line: &[u8], dropped: usize) {
    let text = String::from_utf8_lossy(line);
    if dropped > 0 {
        tracing::info!(seat = %seat, dropped, "agent stderr: {}… ({dropped} more bytes dropped)", text.trim_end());
    } else {
        tracing::info!(seat = %seat, "agent stderr: {}", text.trim_end());
    }
}

fn clip(text: &str) -> String {
    if text.chars().count() <= LOGGED_LINE_CHARS {
        return text.to_string();
    }
    let mut clipped: String = text.chars().take(LOGGED_LINE_CHARS).collect();
    clipped.push('…');
    clipped
}
