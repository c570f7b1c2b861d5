//! How the operator starts the processes it owns (components, control servers): each in a
//! session of its own, so that the signals of the operator's terminal (Ctrl-C's SIGINT, a
//! closed terminal's SIGHUP) reach the operator alone, which then stops the system in order;
//! and each with a parent-death signal, so that none outlives an operator that crashed or was
//! killed.

use std::process::Command;

/// Starts `cmd`'s process in a new session (no controlling terminal: the terminal's signals
/// never reach it, and an ssh it runs cannot prompt on it) that gets SIGTERM when the calling
/// thread ends (the operator's threads that start processes live as long as the operator).
/// The process is not started when its parent is already gone.
pub(crate) fn own_session_ending_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: getpid(2) has no preconditions.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the closure runs in the child between fork and exec and calls only setsid(2),
    // prctl(2) and getppid(2), which are async-signal-safe; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
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

    #[test]
    fn a_child_has_a_session_of_its_own() {
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", "exec cat /proc/self/stat"]).stdout(std::process::Stdio::piped());
        own_session_ending_with_parent(&mut cmd);
        let out = cmd.output().unwrap();
        let stat = String::from_utf8_lossy(&out.stdout).into_owned();
        // pid (comm) state ppid pgrp session tty_nr …, after the command's closing parenthesis.
        let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
        let pid = stat.split_whitespace().next().unwrap();
        assert_eq!(fields[2], pid, "its own process group: {stat}");
        assert_eq!(fields[3], pid, "its own session: {stat}");
        assert_eq!(fields[4], "0", "no controlling terminal: {stat}");
    }
}
