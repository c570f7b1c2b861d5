//! Run provenance with real processes: every data file a run writes (a builder unit's and a
//! recorder's) carries the SHA-256 of the system file in its header, the same digest the run
//! record holds; `daqflow run SYSTEM.toml --repeat N` runs again with run N's stored system
//! file and overrides, and refuses a run that is not there or of another system.

#[path = "../../web/tests/support/cdp.rs"]
mod cdp;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use daqflow_api::RunState;
use daqflow_runcontrol::db::RunDb;
use daqflow_runcontrol::operator::{Operator, OperatorOptions};
use daqflow_runcontrol::provenance::sha256_hex;
use daqflow_wire::file::FileReader;

const BIN: &str = env!("CARGO_BIN_EXE_daqflow");

/// A builder writing files itself (no ET, no recorder): 1 source, 1 RU, 1 BU.
fn builder_files_system(data: &Path) -> String {
    builder_files_system_at(data, 1000.0)
}

/// The same, its source at `rate_hz`.
fn builder_files_system_at(data: &Path, rate_hz: f64) -> String {
    format!(
        r#"[system]
name = "prov-bu"
control = "127.0.0.1:0"
data = "{data}"
web = "none"

[[component]]
name = "evm"
kind = "evm"
[component.params]
rus = 1

[[component]]
name = "bu-0"
kind = "bu"
[component.params]
id = 0
evm = "${{evm.listen}}"
output = "files"
directory = "${{system.data}}/bu-files"

[[component]]
name = "ru-0"
kind = "ru"
[component.params]
id = 0
evm = "${{evm.listen}}"
streams = 1

[[component]]
name = "src-0"
kind = "source"
stop_arg = "${{evm.last_event}}"
[component.params]
source_id = 0
ru = "${{ru-0.listen}}"
rate_hz = {rate_hz:.1}
"#,
        data = data.display()
    )
}

/// A builder into ET with a recorder: 1 source, 1 RU, 1 BU.
fn recorder_system(data: &Path, name: &str, rate_hz: f64) -> String {
    format!(
        r#"[system]
name = "{name}"
control = "127.0.0.1:0"
data = "{data}"
web = "none"

[[component]]
name = "et"
kind = "et"
[component.params]
name = "${{system.id}}-et"
events = 256
event_size = 16384

[[component]]
name = "recorder"
kind = "recorder"
[component.params]
et = "${{et.et}}"
directory = "${{system.data}}/files"

[[component]]
name = "evm"
kind = "evm"
[component.params]
rus = 1

[[component]]
name = "bu-0"
kind = "bu"
[component.params]
id = 0
evm = "${{evm.listen}}"
output = "et"
et = "${{et.et}}"

[[component]]
name = "ru-0"
kind = "ru"
[component.params]
id = 0
evm = "${{evm.listen}}"
streams = 1

[[component]]
name = "src-0"
kind = "source"
stop_arg = "${{evm.last_event}}"
[component.params]
source_id = 0
ru = "${{ru-0.listen}}"
rate_hz = {rate_hz:.1}
"#,
        data = data.display()
    )
}

/// `daqflow run FILE ARGS…`: whether it succeeded, and its output.
fn daqflow_run(file: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(BIN).arg("run").arg(file).args(args).output().unwrap();
    let text = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// The data files (`.daq`) of run `run` in `dir`.
fn files_of_run(dir: &Path, run: u32) -> Vec<PathBuf> {
    let prefix = format!("run{run:06}_");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "daq"))
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&prefix)))
        .collect();
    files.sort();
    files
}

/// The digest in a data file's header, in hex.
fn header_digest(path: &Path) -> String {
    let reader = FileReader::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    reader.header().config_digest.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn every_data_file_of_a_run_carries_the_digest_of_the_system_file_the_run_record_holds() {
    let dir = tempfile::tempdir().unwrap();
    for (system, files_dir) in [
        (builder_files_system(&dir.path().join("bu")), dir.path().join("bu/bu-files")),
        (recorder_system(&dir.path().join("rec"), "prov-rec", 1000.0), dir.path().join("rec/files")),
    ] {
        let file = dir.path().join("system.toml");
        std::fs::write(&file, &system).unwrap();
        let (ok, out) = daqflow_run(&file, &["--start", "--seconds", "2"]);
        assert!(ok, "daqflow run failed:\n{out}");
        let digest = sha256_hex(system.as_bytes());
        let data = files_dir.parent().unwrap();
        let db = RunDb::open(&data.join("runs.sqlite")).unwrap();
        let record = db.run(1).unwrap().unwrap();
        assert_eq!(record.record.state, RunState::Stopped, "{out}");
        let provenance = record.provenance.expect("the run's provenance is recorded");
        assert_eq!(provenance.system_digest, digest, "the run record holds the file's SHA-256");
        assert_eq!(provenance.effective_digest, digest, "nothing was set over the file");
        assert_eq!(provenance.repeat_of, None);
        let bu = &provenance.params["bu-0"];
        assert_eq!(bu["system_digest"], digest.as_str(), "the BU was configured with it: {bu}");
        assert!(bu["evm"].as_str().is_some_and(|a| a.starts_with("127.0.0.1:")), "resolved: {bu}");
        let files = files_of_run(&files_dir, 1);
        assert!(!files.is_empty(), "no data files in {}:\n{out}", files_dir.display());
        for f in &files {
            assert_eq!(header_digest(f), digest, "{}", f.display());
        }
        assert_eq!(record.summary.unwrap().files.len(), files.len());
        // `daqflow inspect` shows it.
        let inspect = Command::new(BIN).args(["inspect", "--json"]).arg(&files[0]).output().unwrap();
        let line: serde_json::Value = serde_json::from_slice(&inspect.stdout).unwrap();
        assert_eq!(line["config_digest"], digest.as_str());
    }
}

#[test]
fn a_repeated_run_takes_the_stored_system_file_and_overrides_of_the_run_it_repeats() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let file = dir.path().join("system.toml");
    let original = recorder_system(&data, "prov-repeat", 1000.0);
    std::fs::write(&file, &original).unwrap();

    // Run 1: the system file with a parameter set over it.
    let system = daqflow_runcontrol::system::SystemFile::parse(&original, &daqflow::registry::standard()).unwrap();
    let op = Operator::launch(OperatorOptions::new(system, BIN.into())).unwrap_or_else(|e| panic!("launch: {e}"));
    op.set("bu-0", "credits", Some(toml::Value::Integer(64))).unwrap();
    let refused = op.set("bu-0", "system_digest", Some(toml::Value::String("0".repeat(64)))).unwrap_err();
    assert!(refused.to_string().contains("set by the operator"), "{refused}");
    op.configure().unwrap();
    let first = op.start(None).unwrap();
    // A live change during the run: recorded in the run's changes, not in what it started with.
    op.set("src-0", "rate_hz", Some(toml::Value::Float(800.0))).unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let summary = op.stop().unwrap();
    assert_eq!((first, summary.lost), (1, 0), "{summary:?}");
    // The next run of this operator starts with the live change: it is in its parameters and
    // its overrides, so it is not run 1's configuration.
    op.start(Some(100)).unwrap();
    op.stop().unwrap();
    op.shutdown();

    // The file on disk changes afterwards; the repeat runs what run 1 stored.
    std::fs::write(&file, recorder_system(&data, "prov-repeat", 500.0)).unwrap();
    let (ok, out) = daqflow_run(&file, &["--repeat", "1", "--start", "--seconds", "2"]);
    assert!(ok, "daqflow run --repeat 1 failed:\n{out}");
    assert!(out.contains("repeating run 1") && out.contains("run 101 started"), "{out}");

    let db = RunDb::open(&data.join("runs.sqlite")).unwrap();
    let one = db.run(1).unwrap().unwrap();
    let two = db.run(101).unwrap().unwrap();
    assert_eq!(two.record.state, RunState::Stopped, "{out}");
    assert_eq!(two.config, one.config, "the stored system file ran again");
    assert!(two.config.contains("rate_hz = 1000.0"), "{}", two.config);
    let (p1, p2) = (one.provenance.unwrap(), two.provenance.unwrap());
    assert_eq!(p1.system_digest, sha256_hex(original.as_bytes()));
    assert_eq!(p2.system_digest, p1.system_digest);
    assert_eq!(p1.overrides, [("bu-0.credits".to_owned(), serde_json::json!(64))].into_iter().collect());
    assert_eq!(p2.overrides, p1.overrides, "run 1's parameters were set again");
    assert_ne!(p1.effective_digest, p1.system_digest, "the override is part of the effective configuration");
    assert_eq!(p2.effective_digest, p1.effective_digest, "the same effective configuration");
    assert_eq!(p2.params["bu-0"]["credits"], 64);
    assert_eq!(p2.params["src-0"]["rate_hz"], 1000.0);
    assert_eq!((p1.repeat_of, p2.repeat_of), (None, Some(1)));
    let changes = db.changes(1).unwrap();
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!((changes[0].component.as_str(), changes[0].key.as_str()), ("src-0", "rate_hz"));
    assert_eq!(changes[0].value, 800.0);
    assert_eq!(one.changes, changes, "the run's record has them");
    assert!(two.changes.is_empty(), "a repeat starts as run 1 started: {:?}", two.changes);
    let p100 = db.run(100).unwrap().unwrap().provenance.unwrap();
    assert_eq!(p100.params["src-0"]["rate_hz"], 800.0, "what src-0 ran with from the live change on");
    assert_eq!(p100.overrides["src-0.rate_hz"], 800.0);
    assert_ne!(p100.effective_digest, p1.effective_digest);
    for f in files_of_run(&data.join("files"), 101) {
        assert_eq!(header_digest(&f), p1.system_digest, "{}", f.display());
    }

    // Refused: a run that is not there, a run of another system.
    let (ok, out) = daqflow_run(&file, &["--repeat", "9", "--start", "--seconds", "1"]);
    assert!(!ok && out.contains("there is no run 9 in the run database"), "{out}");
    let other = dir.path().join("other.toml");
    std::fs::write(&other, recorder_system(&data, "another-system", 1000.0)).unwrap();
    let (ok, out) = daqflow_run(&other, &["--repeat", "1", "--start", "--seconds", "1"]);
    assert!(!ok && out.contains("run 1 is of system `prov-repeat`, not of `another-system`"), "{out}");
    assert_eq!(db.runs(10).unwrap().len(), 3, "no run was taken by a refused repeat");

    // The console's `repeat N` (Operator::repeat) takes run N's parameters only for the system
    // file run N ran with: the file on disk changed since.
    let changed = std::fs::read_to_string(&file).unwrap();
    let system = daqflow_runcontrol::system::SystemFile::parse(&changed, &daqflow::registry::standard()).unwrap();
    let op = Operator::launch(OperatorOptions::new(system, BIN.into())).unwrap_or_else(|e| panic!("launch: {e}"));
    let e = op.repeat(1).unwrap_err().to_string();
    assert!(e.contains("run 1 ran with another system file") && e.contains("--repeat 1"), "{e}");
    let e = op.repeat(77).unwrap_err().to_string();
    assert!(e.starts_with("no run 77 in the run database"), "{e}");
    assert!(op.status().overrides.is_empty(), "nothing was set by a refused repeat");
    op.shutdown();
}

/// The operator's process, killed if the test ends early.
struct OperatorProcess(std::process::Child);

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[test]
fn the_web_ui_of_a_real_operator_shows_a_runs_configuration_and_its_diff_against_another_run() {
    let Some(chromium) = cdp::chromium_or_skip(
        "the_web_ui_of_a_real_operator_shows_a_runs_configuration_and_its_diff_against_another_run",
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let file = dir.path().join("system.toml");
    // Run 1 at 1000 Hz, run 2 after the file changed to 500 Hz.
    for rate_hz in [1000.0, 500.0] {
        std::fs::write(&file, builder_files_system_at(&data, rate_hz)).unwrap();
        let (ok, out) = daqflow_run(&file, &["--start", "--seconds", "1"]);
        assert!(ok, "daqflow run failed:\n{out}");
    }
    let digest = sha256_hex(builder_files_system_at(&data, 500.0).as_bytes());
    let mut op = OperatorProcess(
        Command::new(BIN)
            .args(["run", "--web", "127.0.0.1:0"])
            .arg(&file)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let mut lines = BufReader::new(op.0.stdout.take().unwrap()).lines();
    let first = lines.next().expect("a first line").unwrap();
    std::thread::spawn(move || for _ in lines {});
    let url = first.split("web UI: ").nth(1).unwrap_or_else(|| panic!("no web address in {first:?}")).trim().to_owned();

    let mut browser = cdp::Browser::launch(&chromium).unwrap_or_else(|e| panic!("launching Chromium: {e}"));
    let step = |what: &str, browser: &cdp::Browser, r: Result<serde_json::Value, String>| {
        r.unwrap_or_else(|e| panic!("{what}: {e}\npage errors: {:?}", browser.page_errors))
    };
    let r = browser.navigate(&url).map(|_| serde_json::Value::Null);
    step("load the UI", &browser, r);
    let r = browser.click("#tab-runs").map(|_| serde_json::Value::Null);
    step("runs tab", &browser, r);
    let r = browser.wait_for("run 2 listed", "document.querySelector(\"#runs tr[data-run='2']\") !== null");
    step("runs", &browser, r);
    let r = browser.click("#runs tr[data-run='2']").map(|_| serde_json::Value::Null);
    step("open run 2", &browser, r);
    let r = browser.wait_for(
        "run 2's digest",
        &format!("document.querySelector('#prov-facts').textContent.includes('system file SHA-256 {digest}')"),
    );
    step("provenance", &browser, r);
    let r = browser.eval("document.querySelector('#prov-params').textContent");
    let params = step("params", &browser, r);
    assert!(params.as_str().is_some_and(|t| t.contains("src-0.rate_hz = 500")), "{params}");
    assert!(params.as_str().is_some_and(|t| t.contains(&format!("bu-0.system_digest = \"{digest}\""))), "{params}");
    let r = browser.fill("#prov-diff-run", "1").map(|_| serde_json::Value::Null);
    step("type run 1", &browser, r);
    let r = browser.click("#prov-diff-go").map(|_| serde_json::Value::Null);
    step("diff", &browser, r);
    let r = browser.wait_for(
        "the diff against run 1",
        "document.querySelector('#prov-diff-summary').textContent.startsWith('run 1 → run 2')",
    );
    step("diff summary", &browser, r);
    let r = browser.eval(
        "Array.from(document.querySelectorAll('#prov-diff .diff-del, #prov-diff .diff-add')).map((e) => e.textContent).join('\\n')",
    );
    let changed = step("the changed lines", &browser, r);
    let changed = changed.as_str().unwrap_or_default();
    for line in ["- rate_hz = 1000.0", "+ rate_hz = 500.0", "- src-0.rate_hz = 1000", "+ src-0.rate_hz = 500"] {
        assert!(changed.lines().any(|l| l == line), "{line:?} not in the diff:\n{changed}");
    }
    assert!(!changed.contains("kind = "), "lines both runs share are not changes:\n{changed}");

    // The controller takes a run's configuration over the API (`POST /api/repeat`): run 2's
    // (this very system file), not run 1's (another file).
    let r = browser.eval(
        "(async () => { \
           const post = async (path, body) => { \
             const r = await fetch(path, {method: 'POST', headers: {'X-Daqflow-Client': 'ui', \
               'Content-Type': 'application/json'}, body: JSON.stringify(body)}); \
             return [r.status, await r.json()]; }; \
           return { take: await post('/api/control/take', {}), one: await post('/api/repeat', {run: 1}), \
                    two: await post('/api/repeat', {run: 2}), bad: await post('/api/repeat', {run: 0}) }; })()",
    );
    let answers = step("POST /api/repeat", &browser, r);
    assert_eq!(answers["take"][0], 200, "{answers}");
    assert_eq!(answers["one"][0], 400, "{answers}");
    assert!(
        answers["one"][1]["error"].as_str().is_some_and(|e| e.contains("run 1 ran with another system file")),
        "{answers}"
    );
    assert_eq!(answers["two"][0], 200, "{answers}");
    assert_eq!(answers["two"][1], serde_json::json!({"run": 2, "overrides": {}}), "{answers}");
    assert_eq!(answers["bad"][0], 400, "{answers}");
    assert!(browser.page_errors.is_empty(), "the page reported errors: {:?}", browser.page_errors);
    drop(browser);
    op.0.stdin.as_mut().unwrap().write_all(b"quit\n").unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while op.0.try_wait().unwrap().is_none() {
        assert!(std::time::Instant::now() < deadline, "the operator did not exit");
        std::thread::sleep(Duration::from_millis(100));
    }
}
