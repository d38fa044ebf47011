//! What every child process the node starts (a command agent, a detached
//! run, a tool server) shares: a clean environment and a process group of
//! its own ([`clean_command`]), SIGTERM to the whole group, a bounded
//! grace, then SIGKILL to the group ([`terminate`]) — so a launcher's
//! grandchildren (`npx`, `uvx`, `sh -c`) go with it — and it dies with the
//! node, its group with it ([`die_with_the_node`]): a node killed with
//! `kill -9` leaves no agent, tool server or grandchild acting as a seat a
//! peer now serves. The node starts children from its runtime's worker
//! threads, which live as long as the node.

/// Arrange for `command`'s child, and everything it starts in its group,
/// to be killed when the node dies — even by `kill -9`. On Linux the child
/// splits in two before it runs the program ([`guard`]): the group's leader
/// stays behind as the program's guard, told by the kernel when the node's
/// thread that started it goes (`PR_SET_PDEATHSIG`), and then kills the
/// whole group; the program itself dies with its guard.
pub fn die_with_the_node(command: &mut tokio::process::Command) {
    #[cfg(target_os = "linux")]
    {
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: the closure runs in the child between fork and exec and
        // calls only async-signal-safe functions ([`guard::split`]).
        unsafe {
            command.pre_exec(move || guard::split(parent));
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = command;
}

/// The guard a child leaves behind as its group's leader. It keeps nothing
/// of the node (no file descriptor; every signal but the two it waits on
/// held back, so the group's SIGTERM is the program's to answer), and ends
/// as its program ends, with the same exit status or signal; when the node
/// dies first it kills the group, itself among it.
#[cfg(target_os = "linux")]
mod guard {
    use libc::{pid_t, sigset_t};
    use std::io;

    /// In the child the node forked (the group's leader, already running
    /// as the seat's user in its directory): fork the program's process
    /// and stay as its guard. Returns only in the program's process, which
    /// then execs.
    ///
    /// # Safety
    /// Only between fork and exec; async-signal-safe calls only.
    pub unsafe fn split(parent: pid_t) -> io::Result<()> {
        unsafe {
            let mut all: sigset_t = std::mem::zeroed();
            let mut kept: sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            // Held from here on: the node's death waits for the guard's loop.
            if libc::sigprocmask(libc::SIG_SETMASK, &all, &mut kept) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGHUP as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            // The node died between the fork and the prctl: go too.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            let guard = libc::getpid();
            match libc::fork() {
                -1 => Err(io::Error::last_os_error()),
                0 => {
                    if libc::prctl(
                        libc::PR_SET_PDEATHSIG,
                        libc::SIGKILL as libc::c_ulong,
                        0,
                        0,
                        0,
                    ) != 0
                    {
                        return Err(io::Error::last_os_error());
                    }
                    if libc::getppid() != guard {
                        libc::_exit(1);
                    }
                    if libc::sigprocmask(libc::SIG_SETMASK, &kept, std::ptr::null_mut()) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    Ok(())
                }
                program => watch(program),
            }
        }
    }

    /// The guard's life: wait for the program's end (mirrored) or the
    /// node's death (the group killed).
    unsafe fn watch(program: pid_t) -> ! {
        unsafe {
            // No descriptor of the node's is kept: not the program's pipes
            // (their ends close when the program's do) nor the one the
            // node's spawn waits on to see the program's exec.
            if libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32) != 0 {
                for fd in 0..4096 {
                    libc::close(fd);
                }
            }
            let mut waited: sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut waited);
            libc::sigaddset(&mut waited, libc::SIGCHLD);
            libc::sigaddset(&mut waited, libc::SIGHUP);
            loop {
                match libc::sigwaitinfo(&waited, std::ptr::null_mut()) {
                    libc::SIGHUP => {
                        // The node is gone: so is everything it started here.
                        libc::kill(0, libc::SIGKILL);
                        libc::_exit(137);
                    }
                    libc::SIGCHLD => {
                        let mut status = 0;
                        if libc::waitpid(program, &mut status, libc::WNOHANG) == program {
                            end_as(status);
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    /// End with the program's exit `status`: its code, or its signal.
    unsafe fn end_as(status: libc::c_int) -> ! {
        unsafe {
            if libc::WIFSIGNALED(status) {
                let signal = libc::WTERMSIG(status);
                libc::signal(signal, libc::SIG_DFL);
                let mut only: sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut only);
                libc::sigaddset(&mut only, signal);
                libc::sigprocmask(libc::SIG_UNBLOCK, &only, std::ptr::null_mut());
                libc::kill(libc::getpid(), signal);
                libc::_exit(128 + signal);
            }
            libc::_exit(libc::WEXITSTATUS(status))
        }
    }
}

/// `program` with `args` and exactly `env` — nothing of the node's own
/// environment — killed when its handle is dropped and when the node dies.
pub fn clean_command(
    program: &str,
    args: &[String],
    env: std::collections::BTreeMap<String, String>,
) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .env_clear()
        .envs(env)
        .kill_on_drop(true)
        .process_group(0);
    die_with_the_node(&mut command);
    command
}

/// How long a child's group may take to go after SIGKILL before its
/// teardown is called failed (the kernel reaps a killed process at once;
/// only one stuck in the kernel outlasts this).
pub const KILL_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Send `signal` to the process group `pid` leads (the child's own, from
/// [`clean_command`]); to the process alone when it leads none. Only for a
/// child not reaped yet (its pid is still its own).
fn signal_group(pid: u32, signal: libc::c_int) {
    let pid = pid as libc::pid_t;
    // SAFETY: plain syscalls on a pid the caller has not reaped yet.
    let sent = unsafe { libc::killpg(pid, signal) } == 0 || unsafe { libc::kill(pid, signal) } == 0;
    if !sent {
        tracing::warn!(pid, signal, error = %std::io::Error::last_os_error(), "cannot signal a child");
    }
}

/// Kill what is left of the group a reaped child led (what it started and
/// left behind). The group outlives its leader while any member lives, so
/// its id is still theirs; an empty group is gone, and nothing is sent.
fn kill_leftovers(pid: u32) {
    // SAFETY: killpg on a group id; ESRCH (an empty group) is the usual answer.
    unsafe { libc::killpg(pid as libc::pid_t, libc::SIGKILL) };
}

/// Why a child was not stopped.
#[derive(Debug)]
pub enum NotStopped {
    /// Waiting for it failed.
    Wait(std::io::Error),
    /// It was still running [`KILL_WAIT`] after SIGKILL.
    StillRunning,
}

/// How a child stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stopped {
    pub status: std::process::ExitStatus,
    /// It outlasted its grace after SIGTERM and was killed.
    pub killed: bool,
}

/// Stop `child` and its process group: SIGTERM, up to `grace` to exit,
/// then SIGKILL and up to [`KILL_WAIT`]. A child already exited is reaped
/// (its group is still sent SIGKILL: grandchildren never outlive it).
pub async fn terminate(
    child: &mut tokio::process::Child,
    grace: std::time::Duration,
) -> Result<Stopped, NotStopped> {
    let pid = child.id();
    if let Ok(Some(status)) = child.try_wait() {
        if let Some(pid) = pid {
            kill_leftovers(pid);
        }
        return Ok(Stopped {
            status,
            killed: false,
        });
    }
    let Some(pid) = pid else {
        return child
            .wait()
            .await
            .map(|status| Stopped {
                status,
                killed: false,
            })
            .map_err(NotStopped::Wait);
    };
    signal_group(pid, libc::SIGTERM);
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(Ok(status)) => {
            // The leader went; whatever it left in its group goes too.
            kill_leftovers(pid);
            return Ok(Stopped {
                status,
                killed: false,
            });
        }
        Ok(Err(e)) => return Err(NotStopped::Wait(e)),
        Err(_) => {}
    }
    tracing::warn!(
        pid,
        grace_ms = grace.as_millis() as u64,
        "a child outlasted its grace after SIGTERM; killing its group"
    );
    signal_group(pid, libc::SIGKILL);
    match tokio::time::timeout(KILL_WAIT, child.wait()).await {
        Ok(Ok(status)) => Ok(Stopped {
            status,
            killed: true,
        }),
        Ok(Err(e)) => Err(NotStopped::Wait(e)),
        Err(_) => Err(NotStopped::StillRunning),
    }
}

/// Kill `child` and its process group at once (a detached run past its
/// time, or one whose record was ended), and reap it.
pub async fn kill_group(child: &mut tokio::process::Child) -> std::io::Result<()> {
    if let Some(pid) = child.id() {
        signal_group(pid, libc::SIGKILL);
    }
    child.kill().await
}

/// The node's own process, sealed from its children: not dumpable, so no
/// process of the same user (an agent, a tool server, a run) may read its
/// memory or `/proc/{pid}/environ` (where its NATS password may be), nor
/// attach to it. Called once as a node starts.
pub fn seal_node_process() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: prctl with integer arguments only.
        if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
            tracing::warn!(error = %std::io::Error::last_os_error(), "cannot make the node's process undumpable; its children may read its environment");
        }
    }
}

/// Whether the node's process is sealed ([`seal_node_process`]).
pub fn node_process_sealed() -> bool {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: prctl with integer arguments only.
        unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) == 0 }
    }
    #[cfg(not(target_os = "linux"))]
    false
}

/// Run `command` (a child of `seat`) as `c` says: in the seat's own
/// directory under `c.seats_dir` (made, and kept 0700, owned by the agent
/// user when there is one), as `c.user`.
pub fn confine(
    command: &mut tokio::process::Command,
    c: &crate::config::Confinement,
    seat: &str,
) -> std::io::Result<()> {
    if let Some(root) = &c.seats_dir {
        command.current_dir(seat_dir(root, seat, c.user.as_ref())?);
    }
    if let Some(u) = &c.user {
        command.uid(u.uid).gid(u.gid);
        if let Some(home) = &c.seats_dir {
            command.env("HOME", home.join(seat));
        }
    }
    Ok(())
}

/// `{root}/{seat}`, the seat's own working directory for its children,
/// made and kept private (0700; the seat's owned by `user` when given, the
/// root the node's own).
pub fn seat_dir(
    root: &std::path::Path,
    seat: &str,
    user: Option<&crate::config::AgentUser>,
) -> std::io::Result<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let dir = root.join(seat);
    std::fs::create_dir_all(&dir)?;
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o711))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    if let Some(u) = user {
        std::os::unix::fs::chown(&dir, Some(u.uid), Some(u.gid))?;
    }
    Ok(dir)
}

/// Why `[node] agent_user` names no user the node can run children as.
#[derive(Debug, thiserror::Error)]
pub enum UserError {
    #[error("{0:?} is not a user name")]
    NotAName(String),
    #[error(
        "node.agent_user: there is no user {0:?} on this machine (create it, e.g. `useradd --system --no-create-home {0}`, or remove the key)"
    )]
    NoSuchUser(String),
}

/// The machine's user `name` (`[node] agent_user`), or why not.
pub fn find_user(name: &str) -> Result<crate::config::AgentUser, UserError> {
    let c = std::ffi::CString::new(name).map_err(|_| UserError::NotAName(name.to_string()))?;
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is to memory owned here and sized as passed.
    let rc = unsafe {
        libc::getpwnam_r(
            c.as_ptr(),
            &mut pwd,
            buf.as_mut_ptr(),
            buf.len(),
            &mut found,
        )
    };
    if rc != 0 || found.is_null() {
        return Err(UserError::NoSuchUser(name.to_string()));
    }
    Ok(crate::config::AgentUser {
        name: name.to_string(),
        uid: pwd.pw_uid,
        gid: pwd.pw_gid,
    })
}
