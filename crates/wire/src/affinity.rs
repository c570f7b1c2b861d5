//! Core pinning: a typed set of CPUs and the OS's affinity call, the one place daqflow pins a
//! process or a thread (the engine's schedulers, a component process's `cpus`, the event
//! builder's and the ET system's thread roles).
//!
//! CMS DAQ2 ("Performance of the CMS Event Builder", 2017) pins the event builder's threads to
//! cores of the socket its network card hangs on: the receiving, building and writing threads
//! each get cores of their own so that the operating system never moves them. A [`CpuSet`] is
//! such a choice of CPUs: not empty, no CPU twice, each below `CPU_SETSIZE`. Its text is the
//! kernel's list form (`0-3,8`, what `/proc/PID/status` shows as `Cpus_allowed_list` and
//! `taskset -c` takes).
//!
//! ```
//! use daqflow_wire::affinity::CpuSet;
//!
//! let set: CpuSet = "0-2,5".parse().unwrap();
//! assert_eq!(set.cpus(), vec![0, 1, 2, 5]);
//! assert_eq!(set.to_string(), "0-2,5");
//! assert!(CpuSet::new([1, 1]).is_err()); // CPU 1 twice
//! assert!(CpuSet::new([]).is_err()); // no CPU
//!
//! // Pin this thread to the CPUs it may already use (always allowed).
//! let allowed = daqflow_wire::affinity::allowed().unwrap();
//! daqflow_wire::affinity::pin_current_thread(&allowed).unwrap();
//! ```

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

/// The number of CPUs the affinity call can name (`CPU_SETSIZE`, 1024 on Linux).
pub const MAX_CPUS: usize = 1024;

/// A set of CPUs: not empty, each below [`MAX_CPUS`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CpuSet(BTreeSet<usize>);

/// Why a list of CPUs is not a [`CpuSet`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CpuSetError {
    /// The list names no CPU.
    #[error("names no CPU")]
    Empty,
    /// The list names a CPU twice.
    #[error("names CPU {0} twice")]
    Duplicate(usize),
    /// A CPU number beyond what the affinity call can name.
    #[error("names CPU {0}, beyond the largest the affinity call takes ({max})", max = MAX_CPUS - 1)]
    TooLarge(i64),
    /// A negative CPU number.
    #[error("names CPU {0}: CPU numbers are 0 or more")]
    Negative(i64),
    /// The text is not a list of CPUs.
    #[error("{0:?} is not a list of CPUs like 0-3,8")]
    Syntax(String),
    /// CPUs this process may not use (its allowed set: `sched_getaffinity`, as narrowed by
    /// `taskset`, cgroups or a container).
    #[error("names CPU {outside}, outside the CPUs {whom} may use ({allowed})")]
    NotAllowed {
        /// The CPUs outside the allowed set.
        outside: String,
        /// The allowed set.
        allowed: CpuSet,
        /// Whose allowed set: "this process", "the operator".
        whom: String,
    },
}

/// Why pinning failed.
#[derive(Debug, thiserror::Error)]
pub enum PinError {
    /// The set names CPUs outside the allowed set (nothing was changed).
    #[error("{0}")]
    NotAllowed(CpuSetError),
    /// The OS refused the affinity call.
    #[error("the affinity call failed: {0}")]
    Os(#[source] std::io::Error),
}

impl CpuSet {
    /// The set of `cpus`: refused when empty, when a CPU is named twice or is beyond
    /// [`MAX_CPUS`].
    pub fn new(cpus: impl IntoIterator<Item = usize>) -> Result<CpuSet, CpuSetError> {
        let mut set = BTreeSet::new();
        for cpu in cpus {
            if cpu >= MAX_CPUS {
                return Err(CpuSetError::TooLarge(i64::try_from(cpu).unwrap_or(i64::MAX)));
            }
            if !set.insert(cpu) {
                return Err(CpuSetError::Duplicate(cpu));
            }
        }
        if set.is_empty() {
            return Err(CpuSetError::Empty);
        }
        Ok(CpuSet(set))
    }

    /// The set of the integers of a configuration's list (`cpus = [0, 1]`), refused as
    /// [`CpuSet::new`] does and for a negative number.
    pub fn from_integers(cpus: impl IntoIterator<Item = i64>) -> Result<CpuSet, CpuSetError> {
        let mut list = Vec::new();
        for cpu in cpus {
            if cpu < 0 {
                return Err(CpuSetError::Negative(cpu));
            }
            if cpu >= MAX_CPUS as i64 {
                return Err(CpuSetError::TooLarge(cpu));
            }
            list.push(cpu as usize);
        }
        CpuSet::new(list)
    }

    /// One CPU.
    pub fn single(cpu: usize) -> Result<CpuSet, CpuSetError> {
        CpuSet::new([cpu])
    }

    /// The CPUs, in increasing order.
    pub fn cpus(&self) -> Vec<usize> {
        self.0.iter().copied().collect()
    }

    /// How many CPUs.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Always false: a set has at least one CPU (for clippy's `len_without_is_empty`).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `cpu` is in the set.
    pub fn contains(&self, cpu: usize) -> bool {
        self.0.contains(&cpu)
    }

    /// Refuses CPUs outside `allowed`, naming them, the allowed set and `whom` it belongs to.
    pub fn check_within(&self, allowed: &CpuSet, whom: &str) -> Result<(), CpuSetError> {
        let outside: Vec<usize> = self.0.difference(&allowed.0).copied().collect();
        if outside.is_empty() {
            return Ok(());
        }
        Err(CpuSetError::NotAllowed { outside: list_text(&outside), allowed: allowed.clone(), whom: whom.to_owned() })
    }
}

/// `0-3,8`: runs of consecutive CPUs as ranges.
fn list_text(cpus: &[usize]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        parts.push(if j > i { format!("{}-{}", cpus[i], cpus[j]) } else { cpus[i].to_string() });
        i = j + 1;
    }
    parts.join(",")
}

impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&list_text(&self.cpus()))
    }
}

impl FromStr for CpuSet {
    type Err = CpuSetError;

    /// The kernel's list form: `0`, `0,2`, `0-3,8` (spaces around parts allowed).
    fn from_str(text: &str) -> Result<CpuSet, CpuSetError> {
        let syntax = || CpuSetError::Syntax(text.to_owned());
        let number = |s: &str| -> Result<i64, CpuSetError> {
            let s = s.trim();
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(syntax());
            }
            s.parse::<i64>().map_err(|_| CpuSetError::TooLarge(i64::MAX))
        };
        let mut list = Vec::new();
        for part in text.split(',') {
            match part.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (number(a)?, number(b)?);
                    if a > b {
                        return Err(syntax());
                    }
                    if b >= MAX_CPUS as i64 {
                        return Err(CpuSetError::TooLarge(b));
                    }
                    list.extend(a..=b);
                }
                None => list.push(number(part)?),
            }
        }
        CpuSet::from_integers(list)
    }
}

impl From<CpuSet> for Vec<usize> {
    fn from(set: CpuSet) -> Vec<usize> {
        set.cpus()
    }
}

#[cfg(target_os = "linux")]
fn to_native(set: &CpuSet) -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is a plain bit array; all zeroes is the empty set.
    let mut native: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for cpu in &set.0 {
        // SAFETY: every CPU of a CpuSet is below MAX_CPUS == CPU_SETSIZE (checked by
        // `CpuSet::new` and by the test `max_cpus_is_the_kernel_s_set_size`), so CPU_SET writes
        // inside `native`.
        unsafe { libc::CPU_SET(*cpu, &mut native) };
    }
    native
}

/// The CPUs thread or process `tid` may run on (`0`: the calling thread).
#[cfg(target_os = "linux")]
fn get(tid: libc::pid_t) -> std::io::Result<CpuSet> {
    // SAFETY: all zeroes is a valid empty cpu_set_t.
    let mut native: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: sched_getaffinity writes at most `size_of::<cpu_set_t>()` bytes into `native`,
    // which is that large and lives across the call.
    let rc = unsafe { libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut native) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: CPU_ISSET reads bit `cpu` of `native`, below CPU_SETSIZE == MAX_CPUS.
    let cpus = (0..MAX_CPUS).filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &native) });
    CpuSet::new(cpus).map_err(|e| std::io::Error::other(format!("the kernel's affinity {e}")))
}

#[cfg(target_os = "linux")]
fn set(tid: libc::pid_t, cpus: &CpuSet) -> std::io::Result<()> {
    let native = to_native(cpus);
    // SAFETY: sched_setaffinity reads `size_of::<cpu_set_t>()` bytes of `native`, a valid set
    // that lives across the call.
    let rc = unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &native) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn unsupported() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::Unsupported, "pinning is implemented on Linux only")
}

/// The CPUs this process may use: its main thread's affinity (`sched_getaffinity`), the set
/// `taskset`, cgroups or a container gave it, or the one a component's `cpus` pinned it to (its
/// status shows it). A thread is pinned only inside it.
pub fn allowed() -> std::io::Result<CpuSet> {
    #[cfg(target_os = "linux")]
    {
        get(std::process::id() as libc::pid_t)
    }
    #[cfg(not(target_os = "linux"))]
    {
        Err(unsupported())
    }
}

/// The CPUs the calling thread may run on now.
pub fn current_thread_cpus() -> std::io::Result<CpuSet> {
    #[cfg(target_os = "linux")]
    {
        get(0)
    }
    #[cfg(not(target_os = "linux"))]
    {
        Err(unsupported())
    }
}

/// Pins the calling thread to `cpus`. Refused, with nothing changed, when `cpus` names a CPU
/// outside the process's [`allowed`] set (the kernel would take some of them silently, or
/// move the thread off the process's CPUs).
pub fn pin_current_thread(cpus: &CpuSet) -> Result<(), PinError> {
    #[cfg(target_os = "linux")]
    {
        let allowed = allowed().map_err(PinError::Os)?;
        cpus.check_within(&allowed, "this process").map_err(PinError::NotAllowed)?;
        set(0, cpus).map_err(PinError::Os)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = cpus;
        Err(PinError::Os(unsupported()))
    }
}

/// Pins the whole process to `cpus`: every thread it has now (`/proc/self/task`), and so every
/// thread they start later, which inherits its parent's set. Call it first thing, before any
/// thread is started. Refused, with nothing changed, when `cpus` names a CPU outside the
/// process's [`allowed`] set.
pub fn pin_process(cpus: &CpuSet) -> Result<(), PinError> {
    #[cfg(target_os = "linux")]
    {
        let allowed = allowed().map_err(PinError::Os)?;
        cpus.check_within(&allowed, "this process").map_err(PinError::NotAllowed)?;
        set(0, cpus).map_err(PinError::Os)?;
        for entry in std::fs::read_dir("/proc/self/task").map_err(PinError::Os)? {
            let Some(tid) = entry.ok().and_then(|e| e.file_name().to_str().and_then(|s| s.parse::<libc::pid_t>().ok()))
            else {
                continue;
            };
            match set(tid, cpus) {
                Ok(()) => {}
                // A thread that ended meanwhile.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(e) => return Err(PinError::Os(e)),
            }
        }
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = cpus;
        Err(PinError::Os(unsupported()))
    }
}

/// Pins the process `cmd` starts to `cpus` from its first instruction (the affinity call
/// between fork and exec; the program and every thread it starts inherit it): for a program
/// that cannot pin itself. Refused, with `cmd` unchanged, when `cpus` names a CPU outside this
/// process's [`allowed`] set.
pub fn pin_command(cmd: &mut std::process::Command, cpus: &CpuSet) -> Result<(), PinError> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        let allowed = allowed().map_err(PinError::Os)?;
        cpus.check_within(&allowed, "this process").map_err(PinError::NotAllowed)?;
        let native = to_native(cpus);
        // SAFETY: the closure runs in the child between fork and exec, where only
        // async-signal-safe calls are allowed: it makes one system call (sched_setaffinity, on
        // the set built before the fork and copied into the child) and allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &native) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (cmd, cpus);
        Err(PinError::Os(unsupported()))
    }
}

/// Where a process or thread last ran and the CPU time it has taken: the fields of its
/// `/proc/PID/stat` (or `/proc/PID/task/TID/stat`) that say whether pinning holds and how busy
/// it was. Read by the benchmarks that report each thread's load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskStat {
    /// User plus system time, in clock ticks ([`clock_ticks_per_s`] per second).
    pub cpu_ticks: u64,
    /// The CPU it last ran on.
    pub last_cpu: u32,
}

impl TaskStat {
    /// Parses the text of a `stat` file; `None` if it is not one. The name (field 2) is read
    /// up to its last `)`: a thread may name itself with spaces and parentheses.
    pub fn parse(text: &str) -> Option<TaskStat> {
        TaskStat::parse_bytes(text.as_bytes())
    }

    /// As [`TaskStat::parse`], on the file's bytes: the name the kernel cut at 15 bytes may not
    /// be UTF-8 (cut inside a character); only what follows it is read as text.
    fn parse_bytes(stat: &[u8]) -> Option<TaskStat> {
        let after = stat.iter().rposition(|&b| b == b')')?;
        // After the name: state is field 3, utime and stime fields 14 and 15, processor 39.
        let fields: Vec<&str> = std::str::from_utf8(&stat[after + 1..]).ok()?.split_whitespace().collect();
        let utime: u64 = fields.get(11)?.parse().ok()?;
        let stime: u64 = fields.get(12)?.parse().ok()?;
        Some(TaskStat { cpu_ticks: utime.checked_add(stime)?, last_cpu: fields.get(36)?.parse().ok()? })
    }

    /// Reads and parses `/proc/PID/stat`; `None` if the process is gone or there is no `/proc`.
    pub fn of_process(pid: u32) -> Option<TaskStat> {
        TaskStat::parse_bytes(&std::fs::read(format!("/proc/{pid}/stat")).ok()?)
    }

    /// The stat of this process's first thread named `name`, from `/proc/self/task`; `None`
    /// if there is none (or `name` is empty). Names are compared as the kernel keeps them: their
    /// first 15 bytes, cut anywhere, also inside a character.
    pub fn of_own_thread(name: &str) -> Option<TaskStat> {
        let short = &name.as_bytes()[..name.len().min(15)];
        if short.is_empty() {
            return None;
        }
        for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
            let Ok(comm) = std::fs::read(task.path().join("comm")) else { continue };
            if comm.strip_suffix(b"\n").unwrap_or(&comm) == short {
                return TaskStat::parse_bytes(&std::fs::read(task.path().join("stat")).ok()?);
            }
        }
        None
    }
}

/// The kernel's clock ticks per second, the unit of [`TaskStat::cpu_ticks`] (`sysconf(_SC_CLK_TCK)`,
/// 100 on Linux wherever it was not configured otherwise).
pub fn clock_ticks_per_s() -> f64 {
    #[cfg(unix)]
    {
        // SAFETY: sysconf takes a constant and touches no memory of ours.
        let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        if t > 0 { t as f64 } else { 100.0 }
    }
    #[cfg(not(unix))]
    {
        100.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_gives_cpu_time_and_core_whatever_the_name() {
        // A name with spaces and a closing parenthesis, as a thread may give itself.
        let line = "4242 (rp1 b) (x)) S 1 4242 4242 0 -1 4194560 120 0 0 0 37 5 0 0 20 0 3 0 \
                    100 1000 200 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(TaskStat::parse(line), Some(TaskStat { cpu_ticks: 42, last_cpu: 1 }));
        assert_eq!(TaskStat::parse("4242 (x) S 1 2"), None, "cut short");
        assert_eq!(TaskStat::parse("no name at all"), None);
        // This thread, by its own stat, and the process.
        #[cfg(target_os = "linux")]
        {
            let me = TaskStat::of_process(std::process::id()).unwrap();
            assert!((me.last_cpu as usize) < MAX_CPUS);
            // Names longer than the kernel keeps, one cut inside a two-byte character (`é`
            // spans bytes 15 and 16), each found and charged for the time it spins.
            for name in ["stat-probe-thread-long", "stat-probe-thrée"] {
                let ticks = std::thread::Builder::new()
                    .name(name.into())
                    .spawn(move || {
                        // Spin until the kernel has charged it a tick (at most 3 s).
                        let t = std::time::Instant::now();
                        loop {
                            let ticks = TaskStat::of_own_thread(name).expect("found by its first 15 bytes").cpu_ticks;
                            if ticks > 0 || t.elapsed() > std::time::Duration::from_secs(3) {
                                return ticks;
                            }
                            let spin = std::time::Instant::now();
                            while spin.elapsed() < std::time::Duration::from_millis(10) {
                                std::hint::black_box(0u64);
                            }
                        }
                    })
                    .unwrap()
                    .join()
                    .unwrap();
                assert!(ticks > 0, "{name}: 3 s of spinning took no tick");
            }
            assert!(TaskStat::of_own_thread("no-such-thread").is_none());
            assert!(TaskStat::of_own_thread("").is_none());
        }
        assert!(clock_ticks_per_s() >= 1.0);
    }

    #[test]
    fn lists_parse_and_print_in_the_kernel_s_form() {
        let s: CpuSet = "0-3, 8,10-11".parse().unwrap();
        assert_eq!(s.cpus(), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(s.to_string(), "0-3,8,10-11");
        assert_eq!("5".parse::<CpuSet>().unwrap().to_string(), "5");
        assert_eq!("1,0".parse::<CpuSet>().unwrap().to_string(), "0-1");
        for bad in ["", "a", "1-", "-1", "3-1", "0,,1", "1.5"] {
            assert!(matches!(bad.parse::<CpuSet>(), Err(CpuSetError::Syntax(_))), "{bad:?}");
        }
        assert_eq!("0,0".parse::<CpuSet>(), Err(CpuSetError::Duplicate(0)));
        assert_eq!("0-1,1".parse::<CpuSet>(), Err(CpuSetError::Duplicate(1)));
        assert_eq!("1024".parse::<CpuSet>(), Err(CpuSetError::TooLarge(1024)));
        assert_eq!("0-99999999999999999999".parse::<CpuSet>(), Err(CpuSetError::TooLarge(i64::MAX)));
    }

    #[test]
    fn integer_lists_refuse_empty_negative_duplicate_and_too_large() {
        assert_eq!(CpuSet::from_integers([]), Err(CpuSetError::Empty));
        assert_eq!(CpuSet::from_integers([-1]), Err(CpuSetError::Negative(-1)));
        assert_eq!(CpuSet::from_integers([2, 2]), Err(CpuSetError::Duplicate(2)));
        assert_eq!(CpuSet::from_integers([4096]), Err(CpuSetError::TooLarge(4096)));
        assert_eq!(CpuSet::from_integers([3, 1]).unwrap().cpus(), vec![1, 3]);
        assert_eq!(CpuSet::from_integers([2, 2]).unwrap_err().to_string(), "names CPU 2 twice");
    }

    #[test]
    fn a_set_outside_the_allowed_one_is_named_with_it() {
        let allowed: CpuSet = "0-1".parse().unwrap();
        let asked: CpuSet = "1,999,1000".parse().unwrap();
        let e = asked.check_within(&allowed, "the operator").unwrap_err();
        assert_eq!(e.to_string(), "names CPU 999-1000, outside the CPUs the operator may use (0-1)");
        assert!("0".parse::<CpuSet>().unwrap().check_within(&allowed, "x").is_ok());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn max_cpus_is_the_kernel_s_set_size() {
        assert_eq!(MAX_CPUS, libc::CPU_SETSIZE as usize);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_thread_is_pinned_and_a_cpu_outside_the_allowed_set_is_refused_unchanged() {
        std::thread::spawn(|| {
            let allowed = allowed().unwrap();
            let first = CpuSet::single(allowed.cpus()[0]).unwrap();
            pin_current_thread(&first).unwrap();
            assert_eq!(current_thread_cpus().unwrap(), first);
            // The kernel's own view.
            let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
            let line = status.lines().find(|l| l.starts_with("Cpus_allowed_list:")).unwrap();
            assert_eq!(line.split_whitespace().nth(1).unwrap(), first.to_string());
            // The process's set is untouched: the thread may go back to all of it.
            assert_eq!(super::allowed().unwrap(), allowed);
            // A CPU outside it: refused, nothing changed.
            let far = CpuSet::single(MAX_CPUS - 1).unwrap();
            assert!(matches!(pin_current_thread(&far), Err(PinError::NotAllowed(_))));
            assert_eq!(current_thread_cpus().unwrap(), first);
            pin_current_thread(&allowed).unwrap();
            assert_eq!(current_thread_cpus().unwrap(), allowed);
        })
        .join()
        .unwrap();
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_command_starts_pinned() {
        let first = CpuSet::single(allowed().unwrap().cpus()[0]).unwrap();
        let mut cmd = std::process::Command::new("grep");
        cmd.args(["^Cpus_allowed_list:", "/proc/self/status"]);
        pin_command(&mut cmd, &first).unwrap();
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        assert_eq!(text.split_whitespace().nth(1), Some(first.to_string().as_str()), "{text}");
        let far = CpuSet::single(MAX_CPUS - 1).unwrap();
        assert!(matches!(pin_command(&mut std::process::Command::new("true"), &far), Err(PinError::NotAllowed(_))));
    }
}
