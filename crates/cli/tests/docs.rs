//! The documentation's commands work as written. Every fenced shell and Python block of
//! README.md and docs/*.md is listed in the manifest docs/blocks.toml, either run by a test (this
//! one for `by = "cargo"`; python/tests/test_docs.py for `by = "pytest"`) or not run, with the
//! reason. This test fails on a block missing from the manifest (new, or its text changed) and on
//! an entry whose block is gone, saying what to write; and it runs the `by = "cargo"` blocks as
//! the manifest says, each checking the lines of output the manifest names. The comment at the
//! top of docs/blocks.toml says how a block is run.
//!
//! `cargo test -p daqflow --test docs` (the manifest check alone: `… docs every_block`).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use regex::Regex;
use serde::Deserialize;

const BIN: &str = env!("CARGO_BIN_EXE_daqflow");
const MANIFEST: &str = "docs/blocks.toml";

/// The languages of the blocks the manifest must list.
const SHELL: &[&str] = &["sh", "bash", "shell", "console", "zsh"];
const PYTHON: &[&str] = &["python", "py", "python3"];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

// --- the blocks of the docs --------------------------------------------------------------------

/// A fenced block of a doc.
#[derive(Debug, Clone)]
struct Block {
    /// The file, relative to the repository (`README.md`, `docs/et.md`).
    doc: String,
    /// The line of its opening fence (1-based).
    line: usize,
    /// The first word of the fence's info string, lowercase (`sh`, `python`).
    lang: String,
    /// The lines between the fences, with the opening fence's indentation removed, joined with
    /// `\n`.
    text: String,
    /// The first 16 hex digits of the SHA-256 of `text`.
    id: String,
}

impl Block {
    fn first(&self) -> &str {
        self.text.split('\n').next().unwrap_or("")
    }

    fn is_shell(&self) -> bool {
        SHELL.contains(&self.lang.as_str())
    }

    fn place(&self) -> String {
        format!("{}:{}", self.doc, self.line)
    }
}

/// The shell and Python blocks of one doc.
fn parse_blocks(doc: &str, text: &str) -> Vec<Block> {
    let open = Regex::new(r"^( *)(`{3,}|~{3,})\s*([^\s`]*)").unwrap();
    let lines: Vec<&str> = text.split('\n').collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(c) = open.captures(lines[i]) else {
            i += 1;
            continue;
        };
        let indent = c[1].len();
        let marker = c[2].to_owned();
        let lang = c[3].to_lowercase();
        let fence_char = marker.chars().next().unwrap();
        let closes = |l: &str| {
            let t = l.trim();
            t.len() >= marker.len() && t.chars().all(|ch| ch == fence_char)
        };
        let mut j = i + 1;
        while j < lines.len() && !closes(lines[j]) {
            j += 1;
        }
        let body: Vec<&str> = lines[i + 1..j.min(lines.len())]
            .iter()
            .map(|l| {
                let spaces = l.len() - l.trim_start_matches(' ').len();
                &l[spaces.min(indent)..]
            })
            .collect();
        if SHELL.contains(&lang.as_str()) || PYTHON.contains(&lang.as_str()) {
            let text = body.join("\n");
            let id = daqflow_runcontrol::provenance::sha256_hex(text.as_bytes())[..16].to_owned();
            out.push(Block { doc: doc.to_owned(), line: i + 1, lang, text, id });
        }
        i = j + 1;
    }
    out
}

/// Every shell and Python block of README.md and docs/*.md.
fn doc_blocks(root: &Path) -> Vec<Block> {
    let mut docs = vec!["README.md".to_owned()];
    let mut more: Vec<String> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    more.sort();
    docs.extend(more);
    docs.iter().flat_map(|d| parse_blocks(d, &std::fs::read_to_string(root.join(d)).unwrap())).collect()
}

/// A shell block's command lines: `\` continuations joined (with one space), a quoted string
/// across lines kept whole (with its line breaks), trailing comments removed, blank and
/// comment-only lines left out.
fn command_lines(text: &str) -> Vec<String> {
    let mut joined = Vec::new();
    let mut current = String::new();
    for line in text.split('\n') {
        if !current.is_empty() && open_quote(&current) {
            current.push('\n');
            current.push_str(line);
        } else if let Some(head) = line.trim_end().strip_suffix('\\') {
            current.push_str(if current.is_empty() { head.trim_end() } else { head.trim() });
            current.push(' ');
            continue;
        } else {
            current.push_str(if current.is_empty() { line } else { line.trim_start() });
        }
        if !open_quote(&current) {
            joined.push(std::mem::take(&mut current));
        }
    }
    if !current.is_empty() {
        joined.push(current);
    }
    joined.iter().map(|l| without_comment(l).trim().to_owned()).filter(|l| !l.is_empty()).collect()
}

/// Whether `text` ends inside a quoted string (outside comments).
fn open_quote(text: &str) -> bool {
    let (mut single, mut double) = (false, false);
    let mut previous = ' ';
    for c in text.chars() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && previous.is_whitespace() => return false,
            '\n' => {}
            _ => {}
        }
        previous = c;
    }
    single || double
}

/// A shell line without its comment: from a `#` at the start or after white space, outside
/// quotes.
fn without_comment(line: &str) -> &str {
    let (mut single, mut double) = (false, false);
    let mut previous = ' ';
    for (i, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && previous.is_whitespace() => return &line[..i],
            _ => {}
        }
        previous = c;
    }
    line
}

// --- the manifest ------------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Manifest {
    #[serde(default)]
    block: Vec<Entry>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    doc: String,
    id: String,
    first: String,
    not_run: Option<String>,
    by: Option<String>,
    #[serde(default = "alone")]
    setting: String,
    #[serde(default)]
    needs: Vec<String>,
    #[serde(default)]
    files: BTreeMap<String, String>,
    #[serde(default)]
    script: bool,
    #[serde(default)]
    synopsis: bool,
    #[serde(default)]
    independent: bool,
    #[serde(default)]
    mode: Mode,
    #[serde(default)]
    expect: Vec<String>,
    #[serde(default, rename = "match")]
    matches: Vec<String>,
    timeout: Option<f64>,
    #[serde(default)]
    before: Vec<Step>,
    #[serde(default)]
    step: Vec<Step>,
    #[serde(default)]
    skip: Vec<Skip>,
}

fn alone() -> String {
    "alone".into()
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Mode {
    #[default]
    Exit,
    Background,
    Until,
    Demo,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Step {
    cmd: String,
    #[serde(default)]
    mode: Mode,
    stdin: Option<String>,
    ready: Option<String>,
    #[serde(default)]
    expect: Vec<String>,
    #[serde(default, rename = "match")]
    matches: Vec<String>,
    #[serde(default)]
    after: Vec<String>,
    status: Option<i32>,
    timeout: Option<f64>,
    retry: Option<f64>,
    #[serde(default)]
    creates: BTreeMap<String, String>,
}

impl Step {
    fn checks_output(&self) -> bool {
        !self.expect.is_empty() || !self.matches.is_empty() || !self.creates.is_empty() || !self.after.is_empty()
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Skip {
    cmd: String,
    reason: Option<String>,
    same_as: Option<String>,
}

fn manifest(root: &Path) -> Manifest {
    let text = std::fs::read_to_string(root.join(MANIFEST)).unwrap_or_else(|e| panic!("{MANIFEST}: {e}"));
    toml::from_str(&text).unwrap_or_else(|e| panic!("{MANIFEST}: {e}"))
}

/// A TOML basic string.
fn quoted(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// What to write for a block the manifest lacks.
fn stub(b: &Block) -> String {
    let mut s = format!(
        "[[block]]\ndoc = {}\nid = {}\nfirst = {}\nnot_run = \"WHY\"        # or by = \"cargo\" / \"pytest\" with how to run it and what it prints",
        quoted(&b.doc),
        quoted(&b.id),
        quoted(b.first())
    );
    if b.is_shell() {
        for c in command_lines(&b.text) {
            s.push_str(&format!(
                "\n# [[block.step]] cmd = {}   (expect = [\"…\"]), or [[block.skip]] with a reason",
                quoted(&c)
            ));
        }
    }
    s
}

/// Everything wrong between the docs and the manifest: blocks missing from it, entries whose
/// block is gone, entries that do not say how (or why not) to run, steps that do not match the
/// block's commands or check no output.
fn manifest_problems(blocks: &[Block], manifest: &Manifest) -> Vec<String> {
    let mut problems = Vec::new();
    let by_key: BTreeMap<(&str, &str), &Entry> =
        manifest.block.iter().map(|e| ((e.doc.as_str(), e.id.as_str()), e)).collect();
    let mut seen = BTreeSet::new();
    for e in &manifest.block {
        if !seen.insert((e.doc.as_str(), e.id.as_str())) {
            problems.push(format!("{MANIFEST}: {} id {} is listed twice", e.doc, e.id));
        }
    }
    for b in blocks {
        if by_key.contains_key(&(b.doc.as_str(), b.id.as_str())) {
            continue;
        }
        let changed: Vec<&Entry> = manifest
            .block
            .iter()
            .filter(|e| {
                e.doc == b.doc && e.first == b.first() && !blocks.iter().any(|o| o.doc == e.doc && o.id == e.id)
            })
            .collect();
        match changed.as_slice() {
            [old] => problems.push(format!(
                "{}: the ```{} block starting {} changed: its entry in {MANIFEST} (id = {}) no longer matches. Check that the entry still says the truth about the new text (its steps, what they print), then set id = {}",
                b.place(),
                b.lang,
                quoted(b.first()),
                quoted(&old.id),
                quoted(&b.id)
            )),
            _ => problems.push(format!(
                "{}: the ```{} block starting {} is not in {MANIFEST} (a new block, or its text changed). Add:\n{}",
                b.place(),
                b.lang,
                quoted(b.first()),
                stub(b)
            )),
        }
    }
    for e in &manifest.block {
        let Some(b) = blocks.iter().find(|b| b.doc == e.doc && b.id == e.id) else {
            let changed = blocks.iter().any(|b| b.doc == e.doc && b.first() == e.first);
            if !changed {
                problems.push(format!(
                    "{MANIFEST}: the entry doc = {}, id = {} (first = {}) names no block of the docs any more: remove it",
                    quoted(&e.doc),
                    quoted(&e.id),
                    quoted(&e.first)
                ));
            }
            continue;
        };
        problems.extend(entry_problems(b, e, manifest).into_iter().map(|p| format!("{}: {p}", b.place())));
    }
    problems
}

fn entry_problems(b: &Block, e: &Entry, manifest: &Manifest) -> Vec<String> {
    let mut p = Vec::new();
    if e.first != b.first() {
        p.push(format!("first = {} but the block starts with {}", quoted(&e.first), quoted(b.first())));
    }
    match (&e.not_run, e.by.as_deref()) {
        (Some(r), None) if !r.trim().is_empty() => return p,
        (Some(_), None) => p.push("not_run needs a reason".into()),
        (Some(_), Some(_)) => p.push("give either not_run (with the reason) or by, not both".into()),
        (None, None) => p.push("give either not_run = \"why\" or by = \"cargo\" / \"pytest\"".into()),
        (None, Some("cargo" | "pytest")) => {}
        (None, Some(other)) => p.push(format!("by = {}: say \"cargo\" or \"pytest\"", quoted(other))),
    }
    if !["alone", "demo", "data-files", "control-plane"].contains(&e.setting.as_str()) {
        p.push(format!("setting = {}: one of alone, demo, data-files, control-plane", quoted(&e.setting)));
    }
    for re in e.matches.iter().chain(e.step.iter().chain(&e.before).flat_map(|s| &s.matches)) {
        if let Err(err) = Regex::new(re) {
            p.push(format!("match {}: {err}", quoted(re)));
        }
    }
    let block_checks = !e.expect.is_empty() || !e.matches.is_empty();
    if !b.is_shell() || e.script {
        if !block_checks {
            p.push("a block that runs must check its output: give expect = [\"…\"] or match = [\"…\"]".into());
        }
        if !e.step.is_empty() || !e.skip.is_empty() {
            p.push("steps and skips are for a shell block run line by line".into());
        }
        return p;
    }
    if e.synopsis {
        return p;
    }
    // A shell block run line by line: each command line is a step or a skip.
    let lines = command_lines(&b.text);
    let listed: Vec<&str> =
        e.step.iter().map(|s| s.cmd.as_str()).chain(e.skip.iter().map(|s| s.cmd.as_str())).collect();
    for l in &lines {
        if !listed.contains(&l.as_str()) {
            p.push(format!("its command {} has no [[block.step]] and no [[block.skip]] (with a reason)", quoted(l)));
        }
    }
    for l in &listed {
        if !lines.iter().any(|x| x == l) {
            p.push(format!("cmd = {} is not a command of the block (its commands: {lines:?})", quoted(l)));
        }
    }
    if e.step.is_empty() {
        p.push("every command is skipped: say not_run (with the reason) instead of by".into());
    }
    for s in &e.step {
        // A command in the background serves the block's later steps, which check the output.
        if !s.checks_output() && s.mode != Mode::Background {
            p.push(format!("the step {} checks no output: give expect, match, creates or after", quoted(&s.cmd)));
        }
    }
    for s in &e.skip {
        match (&s.reason, &s.same_as) {
            (Some(r), None) if !r.trim().is_empty() => {}
            (None, Some(other)) => {
                let target = canonical(other);
                let runs = manifest
                    .block
                    .iter()
                    .filter(|x| x.by.is_some())
                    .flat_map(|x| &x.step)
                    .any(|st| canonical(&st.cmd).contains(&target));
                if !runs {
                    p.push(format!("same_as = {}: no step of the manifest runs that command", quoted(other)));
                }
                if canonical(&s.cmd) != target {
                    p.push(format!("same_as = {}: not the same command as {}", quoted(other), quoted(&s.cmd)));
                }
            }
            _ => p.push(format!("the skip {} needs either reason or same_as", quoted(&s.cmd))),
        }
    }
    p
}

/// A command as it runs: `cargo run --release --` and `target/release/daqflow` are `daqflow`.
fn canonical(cmd: &str) -> String {
    cmd.replace("cargo run --release -- ", "daqflow ").replace("target/release/daqflow", "daqflow")
}

#[test]
fn every_block_of_the_docs_is_in_the_manifest() {
    let root = repo();
    let blocks = doc_blocks(&root);
    assert!(blocks.len() > 40, "only {} blocks found: is the parser broken?", blocks.len());
    let problems = manifest_problems(&blocks, &manifest(&root));
    assert!(
        problems.is_empty(),
        "{} problem(s) between the docs and {MANIFEST}:\n\n{}",
        problems.len(),
        problems.join("\n\n")
    );
}

#[test]
fn the_manifest_check_names_a_new_a_changed_and_a_gone_block() {
    let doc = "intro\n```sh\ndaqflow version    # the version\n```\n\n  ```python\n  print(1)\n  ```\n";
    let blocks = parse_blocks("docs/x.md", doc);
    assert_eq!(blocks.len(), 2);
    assert_eq!(blocks[1].text, "print(1)");
    assert_eq!(command_lines(&blocks[0].text), ["daqflow version"]);
    let entry = |id: &str, first: &str| Entry {
        doc: "docs/x.md".into(),
        id: id.into(),
        first: first.into(),
        not_run: Some("a test of the test".into()),
        by: None,
        setting: alone(),
        needs: vec![],
        files: BTreeMap::new(),
        script: false,
        synopsis: false,
        independent: false,
        mode: Mode::Exit,
        expect: vec![],
        matches: vec![],
        timeout: None,
        before: vec![],
        step: vec![],
        skip: vec![],
    };
    let m = Manifest {
        block: vec![entry("0123456789abcdef", "daqflow version    # the version"), entry("fedcba9876543210", "gone()")],
    };
    let problems = manifest_problems(&blocks, &m).join("\n");
    assert!(
        problems.contains("docs/x.md:2: the ```sh block starting \"daqflow version    # the version\" changed"),
        "{problems}"
    );
    assert!(problems.contains(&format!("then set id = \"{}\"", blocks[0].id)), "{problems}");
    assert!(
        problems.contains("docs/x.md:6: the ```python block starting \"print(1)\" is not in docs/blocks.toml"),
        "{problems}"
    );
    assert!(problems.contains(&format!("id = \"{}\"", blocks[1].id)), "{problems}");
    assert!(problems.contains("id = \"fedcba9876543210\" (first = \"gone()\") names no block"), "{problems}");
    assert_eq!(without_comment("echo '#not' \"# not\" # yes"), "echo '#not' \"# not\" ");
    assert_eq!(command_lines("a \\\n    b  # c\n# only\n\nd"), ["a b", "d"]);
    assert_eq!(command_lines("q \"one\n  two\" # c\nnext"), ["q \"one\n  two\"", "next"]);
}

// --- running the blocks ------------------------------------------------------------------------

/// What a block runs in: its directory, and the demo's web UI when it runs against the demo.
struct Ctx {
    dir: PathBuf,
    web: Option<String>,
}

/// The command as this test runs it (docs/blocks.toml's comment lists the substitutions).
fn substitute(cmd: &str, ctx: &Ctx) -> String {
    let mut c = canonical(cmd);
    let paths = Regex::new(r"(^|[\s=])/(tmp|dev/shm)/").unwrap();
    c = paths
        .replace_all(&c, |caps: &regex::Captures| {
            format!("{}{}/{}/", &caps[1], ctx.dir.display(), caps[2].replace('/', "-"))
        })
        .into_owned();
    if let Some(web) = &ctx.web {
        c = c.replace("http://127.0.0.1:8080", web);
    }
    c
}

/// A command started by a step: its output (stdout and stderr, line by line), in its own
/// process group, killed with it when dropped.
struct Running {
    child: Child,
    stdin: Option<std::process::ChildStdin>,
    lines: Arc<Mutex<Vec<String>>>,
    exit: Option<i32>,
}

impl Running {
    fn start(cmd: &str, ctx: &Ctx, stdin: Option<&str>) -> Running {
        let bin_dir = Path::new(BIN).parent().unwrap();
        let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
        let mut child = Command::new("bash")
            .arg("-c")
            .arg(cmd)
            .current_dir(&ctx.dir)
            .env("PATH", path)
            .env("TMPDIR", ctx.dir.join("tmp"))
            .env_remove("DAQFLOW_TOKEN")
            .env_remove("DAQFLOW_TOKEN_FILE")
            .env_remove("DAQFLOW_CONTROL")
            .env_remove("DAQFLOW_LOG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("bash -c {cmd}: {e}"));
        let lines = Arc::new(Mutex::new(Vec::new()));
        for stream in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for l in BufReader::new(stream).lines() {
                    match l {
                        Ok(l) => lines.lock().unwrap().push(l),
                        Err(_) => break,
                    }
                }
            });
        }
        let mut input = child.stdin.take();
        if let (Some(text), Some(w)) = (stdin, input.as_mut()) {
            let _ = w.write_all(text.as_bytes());
            let _ = w.flush();
        }
        Running { child, stdin: input, lines, exit: None }
    }

    fn output(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    fn tail(&self) -> String {
        let out = self.output();
        let from = out.len().saturating_sub(40);
        out[from..].join("\n")
    }

    fn exited(&mut self) -> Option<i32> {
        if self.exit.is_none()
            && let Ok(Some(s)) = self.child.try_wait()
        {
            use std::os::unix::process::ExitStatusExt;
            self.exit = Some(s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0)));
        }
        self.exit
    }

    /// Waits for its end; false after `limit`.
    fn wait(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while self.exited().is_none() {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // The reader threads finish with the pipes.
        std::thread::sleep(Duration::from_millis(100));
        true
    }

    /// Waits until `done` holds for its output; false if it ended first or after `limit`.
    fn wait_for(&mut self, limit: Duration, done: impl Fn(&[String]) -> bool) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            if done(&self.output()) {
                return true;
            }
            if self.exited().is_some() {
                std::thread::sleep(Duration::from_millis(200));
                return done(&self.output());
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn signal_group(&self, sig: i32) {
        // SAFETY: killpg(2) on the process group this test made for the command; no memory is
        // involved.
        unsafe { libc::killpg(self.child.id() as i32, sig) };
    }

    /// Ctrl-C: SIGINT to the command's process (to the whole group when that is the shell
    /// running several commands), then to the group, then SIGKILL; waits `patience` for each.
    fn interrupt(&mut self, patience: Duration) {
        self.stdin = None;
        if self.exited().is_some() {
            // What it started in the background, if anything of its group is left.
            self.signal_group(libc::SIGINT);
            std::thread::sleep(Duration::from_millis(200));
            return;
        }
        let comm = std::fs::read_to_string(format!("/proc/{}/comm", self.child.id())).unwrap_or_default();
        if comm.trim() == "bash" {
            self.signal_group(libc::SIGINT);
        } else {
            // SAFETY: kill(2) on our own child; no memory is involved.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        }
        if self.wait(patience) {
            return;
        }
        self.signal_group(libc::SIGINT);
        if self.wait(Duration::from_secs(5)) {
            return;
        }
        self.signal_group(libc::SIGKILL);
        self.wait(Duration::from_secs(5));
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.signal_group(libc::SIGKILL);
        let _ = self.child.wait();
    }
}

/// Which of `expect` (substrings) and `matches` (regular expressions) no line of `out` has.
fn unmet(out: &[String], expect: &[String], matches: &[String]) -> Vec<String> {
    let mut missing: Vec<String> = expect
        .iter()
        .filter(|e| !out.iter().any(|l| l.contains(e.as_str())))
        .map(|e| format!("a line containing {}", quoted(e)))
        .collect();
    for m in matches {
        let re = Regex::new(m).unwrap();
        if !out.iter().any(|l| re.is_match(l)) {
            missing.push(format!("a line matching {}", quoted(m)));
        }
    }
    missing
}

fn seconds(s: Option<f64>, default: u64) -> Duration {
    s.map_or(Duration::from_secs(default), Duration::from_secs_f64)
}

/// Runs one step; its command started in the background (kept for the block's end), or a
/// problem.
fn run_step(step: &Step, ctx: &Ctx) -> Result<Option<Running>, String> {
    let cmd = substitute(&step.cmd, ctx);
    let fail =
        |r: &Running, what: String| format!("`{}` (run as `{cmd}`): {what}; its output:\n{}", step.cmd, r.tail());
    match step.mode {
        Mode::Exit => {
            let deadline = Instant::now() + seconds(step.retry, 0);
            loop {
                let mut r = Running::start(&cmd, ctx, step.stdin.as_deref());
                r.stdin = None;
                if !r.wait(seconds(step.timeout, 120)) {
                    return Err(fail(&r, format!("not ended after {:?}", seconds(step.timeout, 120))));
                }
                let status = r.exited().unwrap();
                let mut missing = unmet(&r.output(), &step.expect, &step.matches);
                if status != step.status.unwrap_or(0) {
                    missing.insert(0, format!("exit status {}", step.status.unwrap_or(0)));
                }
                for (file, text) in &step.creates {
                    let got = std::fs::read_to_string(ctx.dir.join(file)).unwrap_or_default();
                    if !got.contains(text.as_str()) {
                        missing.push(format!("a file {file} holding {}", quoted(text)));
                    }
                }
                if missing.is_empty() {
                    return Ok(None);
                }
                if Instant::now() >= deadline {
                    return Err(fail(&r, format!("exit status {status}; expected {}", missing.join(", "))));
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        }
        Mode::Background | Mode::Demo => {
            // `daqflow control-server &`: the test puts it in the background itself.
            let cmd = match cmd.trim_end().strip_suffix('&') {
                Some(head) if !head.ends_with('&') => head.to_owned(),
                _ => cmd.clone(),
            };
            let mut r = Running::start(&cmd, ctx, step.stdin.as_deref());
            let ready: Vec<String> = step.ready.iter().cloned().collect();
            if !r.wait_for(seconds(step.timeout, 90), |out| unmet(out, &ready, &[]).is_empty()) {
                let status = r.exited();
                return Err(fail(&r, format!("no line containing {:?} (exit status {status:?})", step.ready)));
            }
            Ok(Some(r))
        }
        Mode::Until => {
            let mut r = Running::start(&cmd, ctx, step.stdin.as_deref());
            let met = r.wait_for(seconds(step.timeout, 90), |out| unmet(out, &step.expect, &step.matches).is_empty());
            let missing = unmet(&r.output(), &step.expect, &step.matches);
            if !met {
                let status = r.exited();
                return Err(fail(&r, format!("expected {} (exit status {status:?})", missing.join(", "))));
            }
            r.interrupt(Duration::from_secs(5));
            let missing = unmet(&r.output(), &step.after, &[]);
            if !missing.is_empty() {
                return Err(fail(&r, format!("after Ctrl-C: expected {}", missing.join(", "))));
            }
            Ok(None)
        }
    }
}

/// Stops a background command and checks what it printed at the end (`after`).
fn stop_background(step: &Step, mut r: Running) -> Result<(), String> {
    let patience = if step.mode == Mode::Demo { Duration::from_secs(120) } else { Duration::from_secs(5) };
    r.interrupt(patience);
    let mut missing = unmet(&r.output(), &step.after, &[]);
    if step.mode == Mode::Demo {
        missing.extend(unmet(&r.output(), &step.expect, &step.matches));
        if r.exited() != Some(step.status.unwrap_or(0)) {
            missing.push(format!("exit status {} (it was {:?})", step.status.unwrap_or(0), r.exited()));
        }
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!("`{}` after Ctrl-C: expected {}; its output:\n{}", step.cmd, missing.join(", "), r.tail()))
    }
}

/// A fresh directory for a block: the repository's `python/` linked into it, the block's files
/// made, `tmp/` and `dev-shm/` for the paths the substitution moves there.
fn block_dir(root: &Path, name: &str, entry: Option<&Entry>) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(dir.join("tmp")).unwrap();
    std::fs::create_dir_all(dir.join("dev-shm")).unwrap();
    let _ = std::os::unix::fs::symlink(repo().join("python"), dir.join("python"));
    if let Some(e) = entry {
        for (file, text) in &e.files {
            std::fs::write(dir.join(file), text).unwrap();
        }
    }
    dir
}

/// Runs the block as the manifest says, in `ctx`; every problem.
fn run_block(b: &Block, e: &Entry, ctx: &Ctx) -> Vec<String> {
    let here = |p: String| format!("{} (```{} starting {}): {p}", b.place(), b.lang, quoted(b.first()));
    let mut problems = Vec::new();
    let mut background: Vec<(Step, Running)> = Vec::new();
    let mut steps: Vec<Step> = e.before.clone();
    if e.synopsis {
        problems.extend(check_synopsis(b).into_iter().map(here));
        return problems;
    }
    if e.script || !b.is_shell() {
        let file = if b.is_shell() { "block.sh" } else { "block.py" };
        let text = if b.is_shell() {
            b.text.split('\n').map(|l| substitute(l, ctx)).collect::<Vec<_>>().join("\n")
        } else {
            b.text.clone()
        };
        std::fs::write(ctx.dir.join(file), text).unwrap();
        steps.push(Step {
            cmd: if b.is_shell() { format!("bash {file}") } else { format!("python3 {file}") },
            mode: e.mode,
            stdin: None,
            ready: None,
            expect: e.expect.clone(),
            matches: e.matches.clone(),
            after: vec![],
            status: None,
            timeout: e.timeout,
            retry: None,
            creates: BTreeMap::new(),
        });
    } else {
        steps.extend(e.step.iter().filter(|s| s.mode != Mode::Demo).cloned());
    }
    for s in &steps {
        let started = Instant::now();
        let result = run_step(s, ctx);
        eprintln!("  {}: `{}`: {:.1} s", b.place(), s.cmd, started.elapsed().as_secs_f64());
        match result {
            Ok(Some(r)) => background.push((s.clone(), r)),
            Ok(None) => {}
            Err(p) => {
                problems.push(here(p));
                break;
            }
        }
    }
    for (s, r) in background.into_iter().rev() {
        if let Err(p) = stop_background(&s, r) {
            problems.push(here(p));
        }
    }
    problems
}

/// A synopsis (`daqflow dialog ls [--filter TEXT] [--json]`): each command's `--help` must list
/// every option the line shows.
fn check_synopsis(b: &Block) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for l in b.text.split('\n') {
        let l = without_comment(l);
        if l.trim_start().starts_with('[') && !lines.is_empty() {
            let last = lines.last_mut().unwrap();
            last.push(' ');
            last.push_str(l.trim());
        } else if !l.trim().is_empty() {
            lines.push(l.trim().to_owned());
        }
    }
    let option = Regex::new(r"--[a-z][a-z0-9-]*").unwrap();
    let mut problems = Vec::new();
    for l in lines {
        let words: Vec<&str> = l.split_whitespace().collect();
        if words.first() != Some(&"daqflow") {
            problems.push(format!("a synopsis line that is not a daqflow command: {l}"));
            continue;
        }
        let sub: Vec<&str> = words[1..]
            .iter()
            .take_while(|w| w.chars().all(|c| c.is_ascii_lowercase() || c == '-') && !w.starts_with('-'))
            .copied()
            .collect();
        let out = Command::new(BIN).args(&sub).arg("--help").output().unwrap();
        let help = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            problems.push(format!(
                "`daqflow {} --help` failed: {}",
                sub.join(" "),
                String::from_utf8_lossy(&out.stderr)
            ));
            continue;
        }
        for o in option.find_iter(&l) {
            let listed = Regex::new(&format!(r"{}([^a-z0-9-]|$)", regex::escape(o.as_str()))).unwrap();
            if !listed.is_match(&help) {
                problems.push(format!(
                    "`daqflow {} --help` does not list {} (the synopsis: {l})",
                    sub.join(" "),
                    o.as_str()
                ));
            }
        }
    }
    problems
}

/// At most this many blocks run at once (CI has 2 cores; most blocks wait on processes).
const AT_ONCE: usize = 2;

struct Gate {
    free: Mutex<(usize, BTreeSet<String>)>,
    changed: Condvar,
}

impl Gate {
    /// Waits for a free slot and for every resource in `needs`; both held until `leave`.
    fn enter(&self, needs: &[String]) {
        let mut g = self.free.lock().unwrap();
        while g.0 == 0 || needs.iter().any(|n| g.1.contains(n)) {
            g = self.changed.wait(g).unwrap();
        }
        g.0 -= 1;
        g.1.extend(needs.iter().cloned());
    }

    fn leave(&self, needs: &[String]) {
        let mut g = self.free.lock().unwrap();
        g.0 += 1;
        for n in needs {
            g.1.remove(n);
        }
        self.changed.notify_all();
    }
}

/// The demo the `demo` setting's blocks run against (the step of mode "demo"), then those blocks
/// in the manifest's order, then Ctrl-C to the demo.
fn run_demo_setting(root: &Path, entries: &[(Block, Entry)]) -> Vec<String> {
    let demo_steps: Vec<(&Block, &Step)> =
        entries.iter().flat_map(|(b, e)| e.step.iter().filter(|s| s.mode == Mode::Demo).map(move |s| (b, s))).collect();
    let [(demo_block, demo_step)] = demo_steps.as_slice() else {
        return vec![format!(
            "{MANIFEST}: the demo setting needs exactly one step of mode \"demo\", not {}",
            demo_steps.len()
        )];
    };
    let mut ctx = Ctx { dir: block_dir(root, "demo", None), web: None };
    let demo = match run_step(demo_step, &ctx) {
        Ok(Some(r)) => r,
        Ok(None) => unreachable!(),
        Err(p) => return vec![format!("{}: {p}", demo_block.place())],
    };
    let web = Regex::new(r"web UI: (http://[0-9.:]+)/").unwrap();
    ctx.web = demo.output().iter().find_map(|l| web.captures(l).map(|c| c[1].to_owned()));
    let mut problems = Vec::new();
    for (b, e) in entries {
        problems.extend(run_block(b, e, &ctx));
    }
    if let Err(p) = stop_background(demo_step, demo) {
        problems.push(format!("{}: {p}", demo_block.place()));
    }
    problems
}

#[test]
fn the_documented_commands_work_as_written() {
    let root = repo();
    let blocks = doc_blocks(&root);
    let m = manifest(&root);
    // On the RAM disk where there is one: the demos' data, and a full disk of the machine would
    // make their recorders throttle (docs/operator-guide.md, "Disk throttling").
    let work =
        if Path::new("/dev/shm").is_dir() { tempfile::tempdir_in("/dev/shm") } else { tempfile::tempdir() }.unwrap();
    let runnable: Vec<(Block, Entry)> = m
        .block
        .iter()
        .filter(|e| e.by.as_deref() == Some("cargo"))
        .filter_map(|e| blocks.iter().find(|b| b.doc == e.doc && b.id == e.id).map(|b| (b.clone(), e.clone())))
        .collect();
    assert!(!runnable.is_empty(), "{MANIFEST} has no block for this test");
    for tool in ["bash", "python3", "sqlite3", "curl", "jq"] {
        let found =
            Command::new("sh").arg("-c").arg(format!("command -v {tool}")).output().is_ok_and(|o| o.status.success());
        assert!(found, "the docs' commands need `{tool}` (CI installs it: .ci/run)");
    }
    let gate = Arc::new(Gate { free: Mutex::new((AT_ONCE, BTreeSet::new())), changed: Condvar::new() });
    let problems = Arc::new(Mutex::new(Vec::new()));
    let t0 = Instant::now();
    std::thread::scope(|scope| {
        let (demo, alone): (Vec<_>, Vec<_>) = runnable.iter().cloned().partition(|(_, e)| e.setting == "demo");
        {
            let (gate, problems, root) = (gate.clone(), problems.clone(), work.path().to_path_buf());
            let needs: Vec<String> =
                demo.iter().flat_map(|(_, e)| e.needs.clone()).chain(["port:8080".to_owned()]).collect();
            scope.spawn(move || {
                gate.enter(&needs);
                let started = Instant::now();
                let p = run_demo_setting(&root, &demo);
                eprintln!("the demo setting: {} block(s), {:.1} s", demo.len(), started.elapsed().as_secs_f64());
                problems.lock().unwrap().extend(p);
                gate.leave(&needs);
            });
        }
        // A block of independent steps is one unit per step.
        let units: Vec<(Block, Entry)> = alone
            .into_iter()
            .flat_map(|(b, e)| {
                if e.independent {
                    e.step.iter().map(|s| (b.clone(), Entry { step: vec![s.clone()], ..e.clone() })).collect()
                } else {
                    vec![(b, e)]
                }
            })
            .collect();
        for (i, (b, e)) in units.into_iter().enumerate() {
            let (gate, problems, root) = (gate.clone(), problems.clone(), work.path().to_path_buf());
            scope.spawn(move || {
                gate.enter(&e.needs);
                let started = Instant::now();
                let dir = block_dir(&root, &format!("{i:02}-{}", b.doc.replace(['/', '.'], "-")), Some(&e));
                let p = run_block(&b, &e, &Ctx { dir, web: None });
                eprintln!("{}: {:.1} s", b.place(), started.elapsed().as_secs_f64());
                problems.lock().unwrap().extend(p);
                gate.leave(&e.needs);
            });
        }
    });
    eprintln!("every block: {:.1} s", t0.elapsed().as_secs_f64());
    let problems = problems.lock().unwrap();
    assert!(
        problems.is_empty(),
        "{} block(s) of the docs do not work as written:\n\n{}",
        problems.len(),
        problems.join("\n\n")
    );
}
