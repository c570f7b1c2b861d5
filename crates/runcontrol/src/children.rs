//! How the operator starts the processes it owns (components, control servers): each kept
//! from the operator's terminal, so that its signals (Ctrl-C's SIGINT, a closed terminal's
//! SIGHUP) reach the operator alone, which then stops the system in order; and each with a
//! parent-death signal, so that none outlives an operator that crashed or was killed.
//!
//! A process of the operator's own binary on this host (`daqflow component`, a control server)
//! gets a process group of its own inside the operator's session ([`Detach::ProcessGroup`]):
//! the terminal signals only its foreground process group, the operator's, and the scheduler
//! keeps sharing the CPU among the threads of the whole system as before. A session of its own
//! would also be a scheduling group of its own where the kernel groups by session (Linux's
//! autogroup, on by default without systemd's cgroups): every component would then get an equal
//! share of a busy machine, an idle-spinning EVM as much as the RU that carries the data, which
//! cost a 2-core machine 15 % of its event-builder rate (docs/performance.md). A process that
//! may run something else (ssh through `remote_command`, a program of the user's own) gets a
//! session of its own ([`Detach::Session`]): no controlling terminal at all, so that nothing it
//! runs can prompt on the operator's terminal or be stopped for reading it.

use std::process::Command;

/// How a child is kept from the operator's terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Detach {
    /// A process group of its own in the operator's session (the operator's own binary).
    ProcessGroup,
    /// A session of its own, without a controlling terminal (ssh, a user's program).
    Session,
}

/// Starts `cmd`'s process detached from the terminal as `how` says, with SIGTERM when the
/// calling thread ends (the operator's threads that start processes live as long as the
/// operator). The process is not started when its parent is already gone.
pub(crate) fn detached_ending_with_parent(cmd: &mut Command, how: Detach) {
    use std::os::unix::process::CommandExt;
    // SAFETY: getpid(2) has no preconditions.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the closure runs in the child between fork and exec and calls only setsid(2) or
    // setpgid(2), prctl(2) and getppid(2), which are async-signal-safe; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            let detached = match how {
                Detach::Session => libc::setsid(),
                Detach::ProcessGroup => libc::setpgid(0, 0),
            };
            if detached < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong, 0, 0, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent ended between fork and prctl: the signal would never come. (No
            // allocation here: an error of the OS's kind, not a message.)
            if libc::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// How a launched binary is named in logs and `ps`: `/proc/self/exe` (the running operator's
/// own binary) as the path it stands for, never as `/proc/self/exe`.
pub(crate) fn shown_binary(binary: &std::path::Path) -> String {
    if binary == std::path::Path::new("/proc/self/exe")
        && let Ok(path) = std::fs::read_link(binary)
    {
        let text = path.display().to_string();
        return text.strip_suffix(" (deleted)").unwrap_or(&text).to_owned();
    }
    binary.display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The child's pid and the `pgrp session tty_nr` fields of its `/proc/self/stat`.
    fn child_stat(how: Detach) -> (String, Vec<String>) {
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", "exec cat /proc/self/stat"]).stdout(std::process::Stdio::piped());
        detached_ending_with_parent(&mut cmd, how);
        let out = cmd.output().unwrap();
        let stat = String::from_utf8_lossy(&out.stdout).into_owned();
        // pid (comm) state ppid pgrp session tty_nr …, after the command's closing parenthesis.
        let fields: Vec<String> =
            stat.rsplit_once(')').unwrap().1.split_whitespace().skip(2).take(3).map(str::to_owned).collect();
        (stat.split_whitespace().next().unwrap().to_owned(), fields)
    }

    #[test]
    fn a_child_that_may_run_ssh_has_a_session_of_its_own() {
        let (pid, f) = child_stat(Detach::Session);
        assert_eq!(f[0], pid, "its own process group: {f:?}");
        assert_eq!(f[1], pid, "its own session: {f:?}");
        assert_eq!(f[2], "0", "no controlling terminal: {f:?}");
    }

    #[test]
    fn a_component_has_a_process_group_of_its_own_in_the_operators_session() {
        let (pid, f) = child_stat(Detach::ProcessGroup);
        // SAFETY: getsid(2) and getpgrp(2) have no preconditions.
        let (session, group) = unsafe { (libc::getsid(0), libc::getpgrp()) };
        assert_eq!(f[0], pid, "its own process group (not the terminal's foreground one): {f:?}");
        assert_ne!(f[0], group.to_string(), "not the operator's process group: {f:?}");
        assert_eq!(f[1], session.to_string(), "the operator's session (and scheduling group): {f:?}");
    }
}
