//! docs/histograms.md's Rust block ("A monitor in Rust") is the example program's code, which
//! CI compiles (`examples/my_monitor.rs`): the two cannot drift apart.

#[test]
fn the_guides_rust_monitor_is_the_example_that_compiles() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("../../docs/histograms.md")).unwrap();
    let example = std::fs::read_to_string(root.join("examples/my_monitor.rs")).unwrap();
    let start = doc.find("```rust\n").expect("a rust block in docs/histograms.md") + "```rust\n".len();
    let block = &doc[start..start + doc[start..].find("```").expect("its end")];
    assert!(
        example.contains(block),
        "docs/histograms.md's Rust block and crates/kinds/examples/my_monitor.rs differ; make them the same:\n{block}"
    );
}
