//! The tables of a system file, read from their headers before the TOML is parsed: a header
//! misspelt (`[[compnent]]`) is named with its line and the table meant, instead of the TOML
//! error it causes further down (a `[component.params]` after it lands in the component before
//! and reads as "duplicate key").
//!
//! ```text
//! line 38: unknown table `[[compnent]]`; did you mean `[[component]]`?
//! ```

/// A table header of the text: its line, whether it is `[[…]]`, and its dotted key.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Header {
    line: usize,
    array: bool,
    key: Vec<String>,
}

impl Header {
    fn text(&self) -> String {
        let key = self.key.join(".");
        if self.array { format!("[[{key}]]") } else { format!("[{key}]") }
    }
}

/// The tables a system file has: `[system]`, `[[component]]` with its `[component.params]`
/// (and any table inside those), `[[group]]`, `[history]`, `[[alarm]]`.
const TOP: [(&str, bool); 5] =
    [("system", false), ("component", true), ("group", true), ("history", false), ("alarm", true)];

/// Every table a system file may have, as written, for the suggestions.
const KNOWN: [&str; 6] = ["[system]", "[[component]]", "[component.params]", "[[group]]", "[history]", "[[alarm]]"];

/// The problems with the text's table headers: unknown tables (with the known one meant, when
/// one is close), and a table written as an array of tables or the other way round.
pub(super) fn check(text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for h in headers(text) {
        let written = h.text();
        let Some(first) = h.key.first() else { continue };
        let known = TOP.iter().find(|(name, _)| name == first);
        let problem = match (known, h.key.len()) {
            (Some((name, array)), 1) if *array != h.array => Some(if *array {
                format!("`{written}` must be `[[{name}]]`: one `[[{name}]]` per {name}")
            } else {
                format!("`{written}` must be `[{name}]`: there is one `[{name}]` table")
            }),
            (Some(_), 1) => None,
            (Some((name, _)), _) if *name == "component" && h.key[1] == "params" => {
                (h.key.len() == 2 && h.array).then(|| {
                    "`[[component.params]]` must be `[component.params]`: one table of parameters per component"
                        .to_owned()
                })
            }
            _ => Some(unknown(&h)),
        };
        if let Some(p) = problem {
            problems.push(format!("line {}: {p}", h.line));
        }
    }
    problems
}

/// What to say of an unknown table: its name, and the known table it is closest to.
fn unknown(h: &Header) -> String {
    let written = h.text();
    let guess = if h.key.len() >= 2 && h.key[0] != "component" && close("component", &h.key[0]) {
        // `[compnent.params]`, `[compnent.parms]`
        Some("[component.params]")
    } else if h.key.len() == 2 && h.key[0] == "component" && close("params", &h.key[1]) {
        Some("[component.params]")
    } else if h.key.len() == 1 && close("params", &h.key[0]) {
        // `[params]` on its own: the component's parameters
        Some("[component.params]")
    } else if h.key.len() == 1 {
        let names: Vec<&str> = TOP.iter().map(|(name, _)| *name).collect();
        suggest(&names, &h.key[0]).and_then(|name| KNOWN.iter().copied().find(|k| k.trim_matches(['[', ']']) == name))
    } else {
        None
    };
    match guess {
        Some(g) => format!("unknown table `{written}`; did you mean `{g}`?"),
        None => format!("unknown table `{written}`; a system file has {}", KNOWN.join(", ")),
    }
}

/// Whether `written` is a likely misspelling of `known` (or is it).
fn close(known: &str, written: &str) -> bool {
    daqflow_component::schema::closest(written, &[known]).is_some()
}

/// The known word `written` is most likely a misspelling of, if any
/// ([`daqflow_component::schema::closest`]).
pub(crate) fn suggest<'a>(known: &[&'a str], written: &str) -> Option<&'a str> {
    daqflow_component::schema::closest(written, known)
}

/// The table headers of a TOML text, outside strings and multi-line arrays.
fn headers(text: &str) -> Vec<Header> {
    let mut out = Vec::new();
    // Inside a multi-line string: its closing quotes.
    let mut in_string: Option<&'static str> = None;
    // How deep inside a multi-line array (or inline table) the value goes on.
    let mut depth = 0usize;
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if in_string.is_none() && depth == 0 && trimmed.starts_with('[') {
            if let Some(h) = header(trimmed, n + 1) {
                out.push(h);
            }
            continue;
        }
        scan_value(line, &mut in_string, &mut depth);
    }
    out
}

/// Follows strings and brackets through one line that is not a header.
fn scan_value(line: &str, in_string: &mut Option<&'static str>, depth: &mut usize) {
    let bytes = line.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        // Inside a character of several bytes (after an escape or a plain step): none of the
        // characters looked for is one, so step on to the next whole character.
        let Some(rest) = line.get(i..) else {
            i += 1;
            continue;
        };
        if let Some(close) = *in_string {
            match rest.find(close) {
                Some(at) => {
                    i += at + close.len();
                    *in_string = None;
                }
                None => return,
            }
            continue;
        }
        match bytes[i] {
            b'#' => return,
            b'"' if rest.starts_with("\"\"\"") => {
                *in_string = Some("\"\"\"");
                i += 3;
            }
            b'\'' if rest.starts_with("'''") => {
                *in_string = Some("'''");
                i += 3;
            }
            b'"' => {
                // A basic string ends at the next quote that is not escaped.
                let mut j = i + 1;
                while j < bytes.len() && bytes[j] != b'"' {
                    j += if bytes[j] == b'\\' { 2 } else { 1 };
                }
                i = j + 1;
            }
            b'\'' => i += rest[1..].find('\'').map_or(bytes.len(), |at| at + 2),
            b'[' | b'{' => {
                *depth += 1;
                i += 1;
            }
            b']' | b'}' => {
                *depth = depth.saturating_sub(1);
                i += 1;
            }
            _ => i += 1,
        }
    }
}

/// A header line (`[a.b]`, `[[a]]`, with spaces or quoted keys), or None if it is not one.
fn header(line: &str, n: usize) -> Option<Header> {
    let (array, inner) = if let Some(rest) = line.strip_prefix("[[") {
        (true, rest.split_once("]]")?.0)
    } else {
        (false, line.strip_prefix('[')?.split_once(']')?.0)
    };
    let key =
        inner.split('.').map(|part| part.trim().trim_matches(|c| c == '"' || c == '\'').to_owned()).collect::<Vec<_>>();
    if key.iter().any(String::is_empty) {
        return None;
    }
    Some(Header { line: n, array, key })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_misspelt_table_is_named_with_the_table_meant() {
        let text = "[system]\nname = 'x'\n\n[[compnent]]\nname = 'a'\nkind = 'sink'\n[component.params]\nx = 1\n";
        assert_eq!(check(text), vec!["line 4: unknown table `[[compnent]]`; did you mean `[[component]]`?"]);
        for (header, meant) in [
            ("[sytem]", "[system]"),
            ("[[alarms]]", "[[alarm]]"),
            ("[[grop]]", "[[group]]"),
            ("[histroy]", "[history]"),
            ("[params]", "[component.params]"),
            ("[component.parms]", "[component.params]"),
            ("[componnet.params]", "[component.params]"),
        ] {
            let p = check(&format!("{header}\n"));
            assert_eq!(p, vec![format!("line 1: unknown table `{header}`; did you mean `{meant}`?")], "{header}");
        }
        let p = check("[[detector]]\n");
        assert!(
            p[0].starts_with("line 1: unknown table `[[detector]]`; a system file has [system], [[component]]"),
            "{p:?}"
        );
    }

    #[test]
    fn characters_of_several_bytes_anywhere_in_a_line_are_stepped_over() {
        // Found by the fuzzer: a plain step, or an escape, into the middle of `─` panicked.
        for line in [
            "source = \"${gen.address}\" 2 RUs ─▶ 2 BUs ─▶ ET ─┬─▶ recorder (files)",
            "a = \"\\é\" ─ [x]",
            "b = 'ü' # ─",
            "c = [ \"─\", 'é' ]",
        ] {
            let text = format!("[system]\n{line}\n[[compnent]]\n");
            assert_eq!(check(&text).len(), 1, "{line}");
        }
    }

    #[test]
    fn tables_and_arrays_of_tables_are_not_confused() {
        assert_eq!(
            check("[component]\n"),
            vec!["line 1: `[component]` must be `[[component]]`: one `[[component]]` per component"]
        );
        assert_eq!(
            check("[[system]]\n"),
            vec!["line 1: `[[system]]` must be `[system]`: there is one `[system]` table"]
        );
        assert!(check("[[component.params]]\n")[0].contains("must be `[component.params]`"));
    }

    #[test]
    fn known_tables_strings_and_arrays_that_look_like_headers_pass() {
        let text = r#"[system]
name = "x"   # [not a header]
[ component ]
[[ "component" ]]
name = 'a'
command = [
  "sh",
[1]
]
note = """
[[compnent]]
"""
lit = '''
[nope]'''
[component.params]
size = { kind = "fixed" }
[component.params.inner]
[[component.params.list]]
[[group]]
[history]
[[alarm]]
"#;
        // `[ component ]` is the one real mistake here (a table, not an array of tables).
        assert_eq!(
            check(text),
            vec!["line 3: `[component]` must be `[[component]]`: one `[[component]]` per component"]
        );
    }

    #[test]
    fn edits_count_swaps_as_one() {
        assert!(close("component", "compnent") && close("component", "componnet"));
        assert!(close("source", "sorce") && !close("evm", "bu") && close("ru", "rus"));
        assert_eq!(suggest(&["source", "sink", "ru"], "sorce"), Some("source"));
        assert_eq!(suggest(&["source", "sink"], "detector"), None);
    }
}
