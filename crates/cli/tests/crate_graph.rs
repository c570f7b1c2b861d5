//! The crate graph that `docs/architecture.md` draws is the one the manifests declare: every
//! normal (not dev-, not build-) dependency of a workspace crate on another workspace crate is
//! an arrow of the ```` ```text crate-graph ```` block, and every arrow there is such a
//! dependency. A new arrow is a design decision: write it into the document with the manifest.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The opening line of the block in `docs/architecture.md`.
const FENCE: &str = "```text crate-graph";

type Arrow = (String, String);

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every normal dependency between workspace packages, from `cargo metadata`; and the
/// workspace's package names.
fn declared_arrows(root: &Path) -> (BTreeSet<Arrow>, BTreeSet<String>) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(&cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(root)
        .output()
        .unwrap_or_else(|e| panic!("running {} metadata: {e}", cargo.to_string_lossy()));
    assert!(out.status.success(), "cargo metadata failed ({}):\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    let metadata: serde_json::Value = serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON");
    let members: BTreeSet<&str> = metadata["workspace_members"]
        .as_array()
        .expect("workspace_members")
        .iter()
        .map(|id| id.as_str().expect("a package id"))
        .collect();
    let packages: Vec<&serde_json::Value> = metadata["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .filter(|p| p["id"].as_str().is_some_and(|id| members.contains(id)))
        .collect();
    let names: BTreeSet<String> =
        packages.iter().map(|p| p["name"].as_str().expect("a package name").to_owned()).collect();
    let mut arrows = BTreeSet::new();
    for p in &packages {
        let from = p["name"].as_str().expect("a package name");
        for d in p["dependencies"].as_array().expect("dependencies") {
            // `kind` is null for a normal dependency, "dev" or "build" otherwise; `name` is the
            // package's name even when the dependency is renamed.
            let to = d["name"].as_str().expect("a dependency name");
            if d["kind"].is_null() && names.contains(to) {
                arrows.insert((from.to_owned(), to.to_owned()));
            }
        }
    }
    (arrows, names)
}

/// The arrows of the block: one `FROM -> TO` per line; blank lines are allowed, anything else
/// is an error naming the line.
fn documented_arrows(doc: &str) -> Result<BTreeSet<Arrow>, String> {
    let mut lines = doc.lines().enumerate().skip_while(|(_, l)| l.trim_end() != FENCE);
    let (start, _) = lines.next().ok_or_else(|| format!("no block opening with `{FENCE}`"))?;
    let mut arrows = BTreeSet::new();
    for (i, line) in lines {
        let line = line.trim();
        if line == "```" {
            if arrows.is_empty() {
                return Err(format!("the block at line {} has no arrows", start + 1));
            }
            return Ok(arrows);
        }
        if line.is_empty() {
            continue;
        }
        let (from, to) = line
            .split_once("->")
            .map(|(f, t)| (f.trim(), t.trim()))
            .filter(|(f, t)| {
                !f.is_empty() && !t.is_empty() && !t.contains("->") && !f.contains(' ') && !t.contains(' ')
            })
            .ok_or_else(|| format!("line {}: `{line}` is not `FROM -> TO`", i + 1))?;
        if !arrows.insert((from.to_owned(), to.to_owned())) {
            return Err(format!("line {}: `{line}` appears twice", i + 1));
        }
    }
    Err(format!("the block at line {} is not closed", start + 1))
}

fn list(arrows: &BTreeSet<Arrow>) -> String {
    arrows.iter().map(|(f, t)| format!("    {f} -> {t}\n")).collect()
}

#[test]
fn the_documented_crate_graph_is_the_one_the_manifests_declare() {
    let root = workspace_root();
    let (declared, names) = declared_arrows(&root);
    let path = root.join("docs/architecture.md");
    let doc = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let documented = documented_arrows(&doc).unwrap_or_else(|e| panic!("docs/architecture.md: {e}"));

    let unknown: BTreeSet<&String> =
        documented.iter().flat_map(|(f, t)| [f, t]).filter(|n| !names.contains(n.as_str())).collect();
    let missing: BTreeSet<Arrow> = declared.difference(&documented).cloned().collect();
    let extra: BTreeSet<Arrow> = documented.difference(&declared).cloned().collect();
    let mut report = String::new();
    if !unknown.is_empty() {
        report += &format!(
            "names in the block that are no workspace package: {}\n  (the packages: {})\n",
            unknown.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "),
            names.iter().map(String::as_str).collect::<Vec<_>>().join(", ")
        );
    }
    if !missing.is_empty() {
        report += &format!(
            "dependencies the manifests declare but docs/architecture.md does not draw (draw them, or remove \
             the dependency):\n{}",
            list(&missing)
        );
    }
    if !extra.is_empty() {
        report += &format!(
            "arrows docs/architecture.md draws but no manifest declares as a normal dependency (add the \
             dependency, or remove the arrow):\n{}",
            list(&extra)
        );
    }
    assert!(report.is_empty(), "the crate graph and docs/architecture.md differ:\n{report}");
}

#[test]
fn the_block_parser_reads_arrows_and_refuses_anything_else() {
    let doc = "# x\n\n```text crate-graph\na -> b\n\nb -> c\n```\n";
    let want: BTreeSet<Arrow> = [("a", "b"), ("b", "c")].map(|(f, t)| (f.to_owned(), t.to_owned())).into();
    assert_eq!(documented_arrows(doc), Ok(want));
    for (doc, why) in [
        ("no block", "no block"),
        ("```text crate-graph\na -> b\n", "not closed"),
        ("```text crate-graph\n```\n", "no arrows"),
        ("```text crate-graph\na => b\n```\n", "line 2: `a => b` is not `FROM -> TO`"),
        ("```text crate-graph\na -> b -> c\n```\n", "is not `FROM -> TO`"),
        ("```text crate-graph\na b -> c\n```\n", "is not `FROM -> TO`"),
        ("```text crate-graph\na -> b\na -> b\n```\n", "line 3: `a -> b` appears twice"),
    ] {
        let e = documented_arrows(doc).unwrap_err();
        assert!(e.contains(why), "{doc:?}: {e}");
    }
}
