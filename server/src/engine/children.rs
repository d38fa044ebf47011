//! What every child process the node starts (a command agent, a detached
//! run, a tool server) shares: a clean environment ([`clean_command`]),
//! SIGTERM then a bounded wait to stop it ([`terminate`]), and it dies with
//! the node. On Linux the child asks the kernel
//! for SIGKILL when the node's thread that started it goes away
//! (`PR_SET_PDEATHSIG`) — so a node killed with `kill -9` leaves no agent
//! acting as a seat a peer now serves. The node starts children from its
//! runtime's worker threads, which live as long as the node.

/// Arrange for `command`'s child to be killed when the node dies.
pub fn die_with_the_node(command: &mut tokio::process::Command) {
    #[cfg(target_os = "linux")]
    {
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: the closure runs in the child between fork and exec and
        // calls only async-signal-safe functions (prctl, getppid, _exit).
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                // The node died between the fork and the prctl: go too.
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = command;
}

/// `program` with `args` and exactly `env` — nothing of the node's own
/// environment — killed when its handle is dropped and when the node dies.
pub fn clean_command(
    program: &str,
    args: &[String],
    env: std::collections::BTreeMap<String, String>,
) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(program);
    command.args(args).env_clear().envs(env).kill_on_drop(true);
    die_with_the_node(&mut command);
    command
}

/// Why a child was not stopped.
#[derive(Debug)]
pub enum NotStopped {
    /// Waiting for it failed.
    Wait(std::io::Error),
    /// It was still running `wait` after SIGTERM.
    StillRunning,
}

/// Stop `child`: SIGTERM, then wait up to `wait` for it to exit. A child
/// already exited is reaped. Never SIGKILLs: a child that will not die is
/// the operator's call.
pub async fn terminate(
    child: &mut tokio::process::Child,
    wait: std::time::Duration,
) -> Result<std::process::ExitStatus, NotStopped> {
    if let Ok(Some(status)) = child.try_wait() {
        return Ok(status);
    }
    if let Some(pid) = child.id() {
        // SAFETY: the child is not reaped yet, so its pid is still its own.
        if unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) } != 0 {
            tracing::warn!(pid, error = %std::io::Error::last_os_error(), "cannot send SIGTERM to a child");
        }
    }
    match tokio::time::timeout(wait, child.wait()).await {
        Ok(Ok(status)) => Ok(status),
        Ok(Err(e)) => Err(NotStopped::Wait(e)),
        Err(_) => Err(NotStopped::StillRunning),
    }
}
