//! What every child process the node starts (a command agent, a detached
//! run) shares: it dies with the node. On Linux the child asks the kernel
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
