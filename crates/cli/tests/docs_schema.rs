//! Every standard kind's table of configuration keys in `docs/` is its typed schema's
//! (`daqflow component KIND --schema`), so that the docs cannot drift from the code: each
//! table sits between `<!-- schema KIND -->` and `<!-- /schema -->` in exactly one document.
//!
//! After changing a kind's schema, `DAQFLOW_UPDATE_DOCS=1 cargo test -p daqflow --test
//! docs_schema` rewrites the tables in place (review the diff).

use std::path::{Path, PathBuf};

const END: &str = "<!-- /schema -->";

fn docs() -> Vec<(PathBuf, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs");
    let mut out: Vec<(PathBuf, String)> = std::fs::read_dir(&dir)
        .expect("docs/")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("a doc");
            (p, text)
        })
        .collect();
    out.sort();
    out
}

/// Every live parameter of the standard kinds, one table (`<!-- schema live -->`).
fn live_table() -> String {
    let mut out = String::from("| kind | live parameter | states | meaning |\n| --- | --- | --- | --- |\n");
    for kind in daqflow::registry::standard().iter() {
        for key in kind.schema.iter().flat_map(|s| s.live_keys()) {
            let states: Vec<&str> = key.live.iter().map(|s| s.name()).collect();
            out.push_str(&format!("| `{}` | `{}` | {} | {} |\n", kind.name, key.name, states.join(", "), key.doc));
        }
    }
    out
}

#[test]
fn every_kind_s_table_of_keys_in_the_docs_is_its_schema_s() {
    let update = std::env::var_os("DAQFLOW_UPDATE_DOCS").is_some();
    let mut docs = docs();
    let mut problems = Vec::new();
    let registry = daqflow::registry::standard();
    let mut tables: Vec<(String, Option<String>)> =
        registry.iter().map(|k| (k.name.to_owned(), k.schema.as_deref().map(|s| s.to_markdown()))).collect();
    tables.push(("live".to_owned(), Some(live_table())));
    for (name, table) in tables {
        let Some(table) = table else {
            problems.push(format!("the kind `{name}` declares no schema"));
            continue;
        };
        let marker = format!("<!-- schema {name} -->");
        let holders: Vec<usize> = (0..docs.len()).filter(|&i| docs[i].1.contains(&marker)).collect();
        let [i] = holders.as_slice() else {
            problems.push(format!(
                "`{marker}` … `{END}` must be in exactly one of docs/*.md (it is in {}): the table of `{name}`'s keys, \
                 `daqflow component {name} --schema`",
                holders.len(),
            ));
            continue;
        };
        let (path, text) = &mut docs[*i];
        let start = text.find(&marker).expect("found") + marker.len();
        let Some(len) = text[start..].find(END) else {
            problems.push(format!("{}: `{marker}` has no `{END}` after it", path.display()));
            continue;
        };
        let want = format!("\n{table}");
        if text[start..start + len] != want {
            if update {
                text.replace_range(start..start + len, &want);
                std::fs::write(&*path, &*text).expect("writing the doc");
            } else {
                problems.push(format!(
                    "{}: the table of `{name}`'s keys is not its schema's; it must read (`daqflow component {name} \
                     --schema`; or DAQFLOW_UPDATE_DOCS=1 cargo test -p daqflow --test docs_schema):\n{want}",
                    path.display(),
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}

#[test]
fn every_standard_kind_checks_its_keys_and_suggests_the_one_meant() {
    let registry = daqflow::registry::standard();
    let mut table = toml::Table::new();
    table.insert("rate_hx".into(), toml::Value::Integer(5));
    let e = registry.make("source", "src-0", table).err().map(|e| e.to_string()).unwrap_or_default();
    assert_eq!(e, "configuration: src-0: `rate_hx`: no such key; did you mean `rate_hz`?");
    for kind in registry.iter() {
        let schema = kind.schema.as_deref().expect("every standard kind has a schema");
        assert_eq!(schema.kind, kind.name);
        assert!(!schema.keys.is_empty(), "{}", kind.name);
        for key in &schema.keys {
            assert!(!key.doc.trim().is_empty(), "{}.{} has no doc", kind.name, key.name);
        }
    }
}
