//! `daqflow soak` as CI runs it: two minutes of the demo's system at full speed with random
//! kill -9 of its restartable components, every run checked (accounting, files, memory, open
//! files, /dev/shm). The soak's own exit status says whether every check held; this test also
//! reads its report to make sure it did kill, and more than once.

use std::process::Command;

#[test]
fn two_minutes_of_runs_with_random_kills_lose_track_of_nothing() {
    let data = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_daqflow"))
        .args(["soak", "--minutes", "2", "--run-seconds", "20", "--kill-every", "4", "--data"])
        .arg(data.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the soak failed:\n{stdout}\n{stderr}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data.path().join("soak.json")).unwrap()).unwrap();
    assert_eq!(report["ok"], true, "{report}");
    let runs = report["runs"].as_array().unwrap();
    assert!(runs.len() >= 4, "{stdout}");
    assert!(report["kills"].as_u64().unwrap() >= 5, "{stdout}");
    for r in runs {
        assert!(r["problems"].as_array().unwrap().is_empty(), "{r}");
        assert!(r["built"].as_u64().unwrap() > 0, "{r}");
    }
    // Something was killed in a run that went on: a component has a second life.
    assert!(runs.iter().any(|r| !r["kills"].as_array().unwrap().is_empty()), "{stdout}");
}
