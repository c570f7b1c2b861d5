//! Test hosts: a few "machines" on this one, each a Linux network namespace with an address of
//! its own, joined by a switch, for tests and benchmarks that need several hosts (components
//! started over ssh, data crossing a network).
//!
//! [`Hosts::create`]`(n)` makes `n` namespaces, host `i` (from 0) with `10.77.0.{i+1}/24` on
//! its `eth0`, and one more namespace, the switch, holding a bridge with a veth pair to every
//! host. Nothing is added to the namespace this process runs in: two sets can exist at once, with
//! the same addresses, and neither sees the other. The file system is not separated: a program
//! started in a host finds every file, the `daqflow` binary included, at its usual path.
//!
//! [`Host::command`] is the `std::process::Command` that runs a program in a host
//! (`ip netns exec NAMESPACE PROGRAM`; `ip` execs the program, so the child's pid is the
//! program's). [`Hosts::start_sshd`] starts an sshd on port 22 of every host, with keys made
//! for this set, and [`Hosts::remote_command`] is the system file's `remote_command` that reaches
//! them. Dropping the set — also while a panic unwinds — kills every process still in its
//! namespaces, sshd's included, and deletes them; a later set also removes what a set of a
//! process that was killed left behind.
//!
//! Namespaces need root (`CAP_SYS_ADMIN`) and iproute2; sshd needs OpenSSH's server and client.
//! [`check`] and [`check_ssh`] say what is missing.
//!
//! ```no_run
//! use std::path::Path;
//! let mut hosts = daqflow::hosts::Hosts::create(2)?;
//! // A control server on the second host, reachable from the first at 10.77.0.2:7000.
//! let mut server = hosts.host(1).command("/usr/local/bin/daqflow")
//!     .args(["control-server", "--listen", "10.77.0.2:7000"])
//!     .spawn()?;
//! println!("{}", hosts.host(0).run("ip", ["-brief", "addr"])?);
//! hosts.start_sshd()?;
//! // The system file's remote_command; a component with host = "10.77.0.2" runs there.
//! let remote = hosts.remote_command(Path::new("/usr/local/bin/daqflow"))?;
//! # let _ = (remote, server.kill());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::ffi::OsStr;
use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The most hosts of one set (the last byte of `10.77.0.N`, 1 … 250).
pub const MAX_HOSTS: usize = 250;

/// Every namespace of a set is named `PREFIX-PID-N-…`: the pid of the process that made it.
const PREFIX: &str = "dqf";

/// How long an sshd may take to listen.
const SSHD_START: Duration = Duration::from_secs(10);

/// How long dropping a set tries to empty a namespace of its processes.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// Why a set of test hosts cannot be made or used.
#[derive(Debug, thiserror::Error)]
pub enum HostsError {
    /// Namespaces need root.
    #[error("network namespaces need root (this process runs as uid {uid})")]
    NotRoot {
        /// The effective user id.
        uid: u32,
    },
    /// A program is not installed.
    #[error("`{tool}` is not installed (Debian package `{package}`)")]
    MissingTool {
        /// The program.
        tool: &'static str,
        /// The Debian package that has it.
        package: &'static str,
    },
    /// A set has 1 … [`MAX_HOSTS`] hosts.
    #[error("a set of test hosts has 1 … {MAX_HOSTS} hosts, not {0}")]
    Count(usize),
    /// A command failed.
    #[error("`{command}` failed: {reason}")]
    Command {
        /// The command line.
        command: String,
        /// Its exit and what it wrote on its standard error.
        reason: String,
    },
    /// A file or directory could not be made.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// An sshd did not listen in time, or ended.
    #[error("sshd on {addr} did not start listening within {SSHD_START:?}: {log}")]
    Sshd {
        /// The host's address.
        addr: Ipv4Addr,
        /// Its exit, if it ended, and its log.
        log: String,
    },
    /// [`Hosts::remote_command`] before [`Hosts::start_sshd`].
    #[error("no sshd runs in these hosts: call start_sshd first")]
    NoSshd,
}

/// The programs a set needs, with their Debian packages.
const IP: (&str, &str) = ("ip", "iproute2");
const SSH_TOOLS: [(&str, &str); 3] =
    [("sshd", "openssh-server"), ("ssh", "openssh-client"), ("ssh-keygen", "openssh-client")];

/// Whether test hosts can be made here: root and `ip`.
pub fn check() -> Result<(), HostsError> {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    if uid != 0 {
        return Err(HostsError::NotRoot { uid });
    }
    program(IP).map(drop)
}

/// Whether [`Hosts::start_sshd`] can work here: [`check`], and `sshd`, `ssh` and `ssh-keygen`.
pub fn check_ssh() -> Result<(), HostsError> {
    check()?;
    SSH_TOOLS.iter().try_for_each(|&t| program(t).map(drop))
}

/// The path of a program: in `PATH`, else in the system's `sbin` and `bin` directories (a test
/// may run with a `PATH` without `/usr/sbin`).
fn program((tool, package): (&'static str, &'static str)) -> Result<PathBuf, HostsError> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(tool))
        .find(|p| p.is_file())
        .ok_or(HostsError::MissingTool { tool, package })
}

/// One host of a set.
#[derive(Debug, Clone)]
pub struct Host {
    namespace: String,
    addr: Ipv4Addr,
    ip: PathBuf,
}

impl Host {
    /// Its network namespace's name (`ip netns exec NAME …`).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Its address, `10.77.0.N`.
    pub fn addr(&self) -> Ipv4Addr {
        self.addr
    }

    /// A command running `program` in this host: `ip netns exec NAMESPACE PROGRAM`; add the
    /// arguments, environment and standard streams as for any command.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new(&self.ip);
        cmd.args(["netns", "exec"]).arg(&self.namespace).arg(program);
        cmd
    }

    /// Runs `program ARGS` in this host to its end; its standard output, or why it failed.
    pub fn run<I, S>(&self, program: &str, args: I) -> Result<String, HostsError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = self.command(program);
        cmd.args(args);
        output(&mut cmd)
    }

    /// The processes in this host now (`ip netns pids`).
    pub fn pids(&self) -> Result<Vec<u32>, HostsError> {
        let mut cmd = Command::new(&self.ip);
        cmd.args(["netns", "pids", &self.namespace]);
        Ok(output(&mut cmd)?.split_whitespace().filter_map(|p| p.parse().ok()).collect())
    }
}

/// Waits for `child` to end, at most `timeout`: its exit, or `None` if it still runs.
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> std::io::Result<Option<ExitStatus>> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs a command to its end: its standard output, or its exit and standard error.
fn output(cmd: &mut Command) -> Result<String, HostsError> {
    let line = command_line(cmd);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| HostsError::Command { command: line.clone(), reason: e.to_string() })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(HostsError::Command { command: line, reason: format!("{}: {}", out.status, stderr.trim()) });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn command_line(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The keys and configuration of the sshd's of a set.
#[derive(Debug)]
struct Ssh {
    client_key: PathBuf,
    daemons: Vec<Child>,
}

/// A set of test hosts; dropping it removes them and everything running in them.
#[derive(Debug)]
pub struct Hosts {
    /// `dqf-PID-N`: every namespace's name starts with it.
    name: String,
    ip: PathBuf,
    /// The switch's namespace, once made.
    switch: Option<String>,
    hosts: Vec<Host>,
    /// Keys, configurations and logs of the sshd's (made by `start_sshd`).
    dir: Option<PathBuf>,
    ssh: Option<Ssh>,
}

impl Hosts {
    /// Makes `n` hosts, `10.77.0.1` … `10.77.0.n`, joined by a switch. A namespace of this
    /// naming left by a process that no longer runs (one killed in a test) is removed first.
    pub fn create(n: usize) -> Result<Hosts, HostsError> {
        check()?;
        if !(1..=MAX_HOSTS).contains(&n) {
            return Err(HostsError::Count(n));
        }
        let ip = program(IP)?;
        remove_stale(&ip);
        static SETS: AtomicU32 = AtomicU32::new(0);
        let name = format!("{PREFIX}-{}-{}", std::process::id(), SETS.fetch_add(1, Ordering::Relaxed));
        // Everything made is recorded at once, so that dropping a set made half removes it.
        let mut set = Hosts { name, ip, switch: None, hosts: Vec::new(), dir: None, ssh: None };
        let switch = format!("{}-sw", set.name);
        set.ip(["netns", "add", &switch])?;
        set.switch = Some(switch.clone());
        set.ip(["-n", &switch, "link", "add", "br0", "type", "bridge"])?;
        set.ip(["-n", &switch, "link", "set", "br0", "up"])?;
        for i in 0..n {
            let host = Host {
                namespace: format!("{}-h{}", set.name, i + 1),
                addr: Ipv4Addr::new(10, 77, 0, (i + 1) as u8),
                ip: set.ip.clone(),
            };
            set.ip(["netns", "add", &host.namespace])?;
            let ns = host.namespace.clone();
            let port = format!("p{}", i + 1);
            set.hosts.push(host);
            // The pair is made in the switch with its other end directly in the host.
            set.ip(["-n", &switch, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &ns])?;
            set.ip(["-n", &switch, "link", "set", &port, "master", "br0", "up"])?;
            set.ip(["-n", &ns, "addr", "add", &format!("10.77.0.{}/24", i + 1), "dev", "eth0"])?;
            set.ip(["-n", &ns, "link", "set", "eth0", "up"])?;
            set.ip(["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(set)
    }

    fn ip<const N: usize>(&self, args: [&str; N]) -> Result<String, HostsError> {
        output(Command::new(&self.ip).args(args))
    }

    /// How many hosts.
    pub fn len(&self) -> usize {
        self.hosts.len()
    }

    /// Whether the set has no host (never: a set has at least one).
    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
    }

    /// Host `i` (from 0; its address is `10.77.0.{i+1}`). Panics if there is no such host.
    pub fn host(&self, i: usize) -> &Host {
        &self.hosts[i]
    }

    /// Every host.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// The switch's namespace (a bridge `br0` and a port `pN` to each host `10.77.0.N`).
    pub fn switch(&self) -> &str {
        self.switch.as_deref().unwrap_or_default()
    }

    /// A directory of this set's own (mode 0700), removed with it.
    fn dir(&mut self) -> Result<PathBuf, HostsError> {
        if let Some(d) = &self.dir {
            return Ok(d.clone());
        }
        use std::os::unix::fs::DirBuilderExt;
        let dir = std::env::temp_dir().join(&self.name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|source| HostsError::Io { what: format!("creating {}", dir.display()), source })?;
        self.dir = Some(dir.clone());
        Ok(dir)
    }

    /// Starts an sshd on port 22 of every host and waits until each listens. Root may log in
    /// with a key made for this set (see [`Hosts::remote_command`]), and with nothing else: no
    /// password, no PAM. Each sshd's log is `sshd-N.log` in the set's directory.
    pub fn start_sshd(&mut self) -> Result<(), HostsError> {
        check_ssh()?;
        if self.ssh.is_some() {
            return Ok(());
        }
        let [sshd, _, keygen] = SSH_TOOLS.map(program);
        let (sshd, keygen) = (sshd?, keygen?);
        let dir = self.dir()?;
        let io = |what: String| move |source| HostsError::Io { what, source };
        for key in ["host_key", "client_key"] {
            let path = dir.join(key);
            output(
                Command::new(&keygen)
                    .args(["-q", "-t", "ed25519", "-N", "", "-C", &format!("daqflow test {key}"), "-f"])
                    .arg(&path),
            )?;
        }
        let authorized = dir.join("authorized_keys");
        std::fs::copy(dir.join("client_key.pub"), &authorized)
            .map_err(io(format!("writing {}", authorized.display())))?;
        // sshd's privilege separation directory (Debian's packages make it at boot only).
        std::fs::create_dir_all("/run/sshd").map_err(io("creating /run/sshd".into()))?;
        // Recorded before any sshd starts: dropping the set ends them, whatever happens next.
        self.ssh = Some(Ssh { client_key: dir.join("client_key"), daemons: Vec::new() });
        let hosts = self.hosts.clone();
        for (i, host) in hosts.iter().enumerate() {
            let config = dir.join(format!("sshd_config-{}", i + 1));
            let text = format!(
                "ListenAddress {addr}:22\n\
                 HostKey {dir}/host_key\n\
                 AuthorizedKeysFile {dir}/authorized_keys\n\
                 PermitRootLogin prohibit-password\n\
                 PubkeyAuthentication yes\n\
                 PasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\n\
                 UsePAM no\n\
                 StrictModes no\n\
                 PidFile none\n\
                 PrintMotd no\n\
                 X11Forwarding no\n\
                 UseDNS no\n\
                 MaxStartups 100\n",
                addr = host.addr,
                dir = dir.display()
            );
            let mut f = std::fs::File::create(&config).map_err(io(format!("writing {}", config.display())))?;
            f.write_all(text.as_bytes()).map_err(io(format!("writing {}", config.display())))?;
            let log_path = dir.join(format!("sshd-{}.log", i + 1));
            let log = std::fs::File::create(&log_path).map_err(io(format!("creating {}", log_path.display())))?;
            let err = log.try_clone().map_err(io(format!("opening {}", log_path.display())))?;
            let mut cmd = host.command(&sshd);
            cmd.args(["-D", "-e", "-f"]).arg(&config).stdin(Stdio::null()).stdout(log).stderr(err);
            let child = cmd.spawn().map_err(io(format!("starting {}", command_line(&cmd))))?;
            let pid = child.id();
            let daemons = &mut self.ssh.as_mut().expect("set above").daemons;
            daemons.push(child);
            let daemon = daemons.last_mut().expect("just pushed");
            let deadline = Instant::now() + SSHD_START;
            while !std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).is_ok_and(|t| listening(&t, 22)) {
                let ended = daemon.try_wait().ok().flatten();
                if ended.is_some() || Instant::now() >= deadline {
                    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                    let exit = ended.map_or(String::new(), |s| format!("it ended ({s}); "));
                    return Err(HostsError::Sshd { addr: host.addr, log: format!("{exit}{}", log.trim()) });
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }

    /// The system file's `remote_command` reaching these hosts' sshd's and running `program`
    /// there (the file system is shared, so the path of this `daqflow` works):
    /// `ssh -i KEY -o BatchMode=yes … {host} PROGRAM`.
    pub fn remote_command(&self, program: &Path) -> Result<String, HostsError> {
        let ssh = self.ssh.as_ref().ok_or(HostsError::NoSshd)?;
        let client = self::program(SSH_TOOLS[1])?;
        Ok(format!(
            "{} -i {} -o BatchMode=yes -o IdentitiesOnly=yes -o StrictHostKeyChecking=no \
             -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR {{host}} {}",
            client.display(),
            ssh.client_key.display(),
            program.display()
        ))
    }

    /// The sshd log of host `i`, once [`Hosts::start_sshd`] ran.
    pub fn sshd_log(&self, i: usize) -> Option<String> {
        let dir = self.dir.as_ref()?;
        std::fs::read_to_string(dir.join(format!("sshd-{}.log", i + 1))).ok()
    }

    /// The namespaces of the set, the switch last.
    fn namespaces(&self) -> Vec<String> {
        self.hosts.iter().map(|h| h.namespace.clone()).chain(self.switch.clone()).collect()
    }
}

/// Whether a `/proc/PID/net/tcp` text (the sockets of PID's network namespace) has a socket
/// listening (state 0A) on local port `port`.
fn listening(proc_net_tcp: &str, port: u16) -> bool {
    let local = format!(":{port:04X}");
    proc_net_tcp.lines().skip(1).any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 3 && f[1].ends_with(&local) && f[3] == "0A"
    })
}

/// Kills every process in namespace `ns` (SIGKILL, until none is left or [`KILL_WAIT`]
/// passed) and deletes it.
fn remove_namespace(ip: &Path, ns: &str) {
    let deadline = Instant::now() + KILL_WAIT;
    loop {
        let pids: Vec<i32> = output(Command::new(ip).args(["netns", "pids", ns]))
            .map(|o| o.split_whitespace().filter_map(|p| p.parse().ok()).collect())
            .unwrap_or_default();
        if pids.is_empty() || Instant::now() >= deadline {
            break;
        }
        for pid in pids {
            // SAFETY: kill(2) has no memory effects; the pid was in a namespace of this set a
            // moment ago, and every process there belongs to the set.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if let Err(e) = output(Command::new(ip).args(["netns", "del", ns])) {
        eprintln!("daqflow hosts: {e}");
    }
}

/// Removes the namespaces of sets whose process no longer runs.
fn remove_stale(ip: &Path) {
    let Ok(list) = output(Command::new(ip).args(["netns", "list"])) else { return };
    for ns in list.lines().filter_map(|l| l.split_whitespace().next()) {
        let mut parts = ns.split('-');
        if parts.next() != Some(PREFIX) {
            continue;
        }
        let Some(pid) = parts.next().and_then(|p| p.parse::<u32>().ok()) else { continue };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            remove_namespace(ip, ns);
        }
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        if let Some(ssh) = self.ssh.as_mut() {
            for d in &mut ssh.daemons {
                let _ = d.kill();
                let _ = d.wait();
            }
        }
        for ns in self.namespaces() {
            remove_namespace(&self.ip, &ns);
        }
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_found_in_sbin_without_path_or_named_with_their_package() {
        match program(("daqflow-no-such-tool", "no-such-package")) {
            Err(e @ HostsError::MissingTool { .. }) => {
                assert_eq!(e.to_string(), "`daqflow-no-such-tool` is not installed (Debian package `no-such-package`)")
            }
            other => panic!("{other:?}"),
        }
        assert!(program(("sh", "dash")).is_ok());
    }

    #[test]
    fn a_listening_socket_is_recognised_in_proc_net_tcp() {
        let text = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 02004D0A:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0
   1: 0100007F:1F90 0100007F:0016 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0 20 4 30 10 -1
";
        assert!(listening(text, 22));
        // Connected (01) to a port 22 elsewhere, or listening on another port: no.
        assert!(!listening(text, 8080));
        assert!(!listening(&text.replace(" 0A ", " 01 "), 22));
        assert!(!listening("", 22));
    }
}
