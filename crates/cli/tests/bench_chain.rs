//! `daqflow bench chain --quick`: the DAQ-Middleware chain as processes, every point measured,
//! every chunk accounted for, and the table, CSV, JSON and PNG written.

use std::process::Command;

#[test]
fn bench_chain_quick_runs_every_chain_as_processes_and_writes_the_files() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o = Command::new(env!("CARGO_BIN_EXE_daqflow"))
        .args(["bench", "chain", "--quick", "--seconds", "0.2", "--out", out.to_str().unwrap()])
        .output()
        .expect("run daqflow");
    let t = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    // The suite fails (exit 1) if a chunk was lost or a component reported an error.
    assert!(o.status.success(), "{t}");
    for want in [
        "[chain]",
        "[splice]",
        "[fanout_copy]",
        "[fanout_round_robin]",
        "[logger]",
        "[logger_monitor]",
        "raw reference",
        "target: generator → repeater → sink",
        "target: the logger's rate beside a 10 ms/chunk sampling monitor ≥ 90% of its rate alone — measured 64 KiB",
    ] {
        assert!(t.contains(want), "{want} missing from:\n{t}");
    }
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("chain.json")).unwrap()).unwrap();
    let points = json.as_array().unwrap();
    let mut seen: Vec<(u64, u64)> = points
        .iter()
        .filter(|p| p["case"] == "chain")
        .map(|p| (p["params"]["repeaters"].as_u64().unwrap(), p["params"]["chunk_bytes"].as_u64().unwrap()))
        .collect();
    seen.sort();
    let mut want = Vec::new();
    for k in [0, 1, 2] {
        for c in [4096, 65536, 1 << 20] {
            want.push((k, c));
        }
    }
    assert_eq!(seen, want, "{json}");
    assert_eq!(points.iter().filter(|p| p["case"] == "splice").count(), 1, "{json}");
    // The dispatcher's fan-out cases, at 64 KiB in a quick run: every chunk accounted for
    // (the run fails otherwise), the slow monitor's drops counted.
    for case in ["fanout_copy", "fanout_round_robin", "logger", "logger_monitor"] {
        let p: Vec<_> = points.iter().filter(|p| p["case"] == case).collect();
        assert_eq!(p.len(), 1, "{case}: {json}");
        assert_eq!(p[0]["params"]["chunk_bytes"].as_u64(), Some(65536), "{case}: {json}");
        assert!(p[0]["metrics"]["mb_per_s"].as_f64().unwrap() > 0.0, "{case}: {json}");
    }
    let slow = points.iter().find(|p| p["case"] == "logger_monitor").unwrap();
    assert!(slow["metrics"]["monitor_dropped"].as_f64().unwrap() > 0.0, "{slow}");
    for p in points.iter().filter(|p| p["case"] == "chain" || p["case"] == "splice") {
        for m in ["mb_per_s", "raw_mb_per_s", "chunks_per_s"] {
            assert!(p["metrics"][m].as_f64().unwrap() > 0.0, "{m} in {p}");
        }
        // The ratio, or, against a reference that did not measure the path's limit (a loaded
        // machine can cause one), the reason it was withheld.
        match p["metrics"]["ratio_to_raw"].as_f64() {
            Some(r) => assert!(r > 0.0, "ratio_to_raw in {p}"),
            None => assert!(p["withheld"]["ratio_to_raw"]["why"].as_str().unwrap().contains("the reference"), "{p}"),
        }
    }
    let csv = std::fs::read_to_string(out.join("chain.csv")).unwrap();
    assert!(csv.starts_with("case,chunk_bytes,repeaters,outputs,mb_per_s,"), "{csv}");
    let png = std::fs::read(out.join("chain.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
}
