//! Run provenance: what a run was configured from, kept in its run record and, as the system
//! file's digest, in the header of every data file it wrote (`docs/operator-guide.md`,
//! "Provenance").
//!
//! - The **system digest** is the SHA-256 of the system file's bytes exactly as read: it names
//!   the file, and is what the operator gives the components that write data files
//!   (`${system.digest}`, and the reserved key `system_digest` of every kind that
//!   [takes it](daqflow_component::Kind::takes_system_digest)).
//! - The **effective configuration** is the system file followed by one comment line per
//!   parameter set over it (`# set COMPONENT.KEY = VALUE`, the value in JSON, in key order):
//!   still a valid system file, and the text the web UI compares between runs. Its SHA-256 is
//!   the **effective digest**, equal to the system digest when nothing was set.
//!
//! ```
//! use std::collections::BTreeMap;
//! use daqflow_runcontrol::provenance::{effective_config, sha256_hex};
//! let text = "[system]\nname = 'x'\n";
//! assert_eq!(sha256_hex(b"abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
//! assert_eq!(effective_config(text, &BTreeMap::new()), text);
//! let set = BTreeMap::from([("bu-0.credits".to_owned(), serde_json::json!(64))]);
//! assert!(effective_config(text, &set).ends_with("# set bu-0.credits = 64\n"));
//! ```

use std::collections::BTreeMap;

use daqflow_api::RunProvenance;
use serde_json::Value;
use sha2::{Digest as _, Sha256};

/// The SHA-256 of `bytes`, as 64 lowercase hex digits.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// The line that heads the overrides in an effective configuration.
const OVERRIDES_HEADING: &str = "# parameters set over the system file (daqflow `set`), applied at configure:";

/// The effective configuration: the system file's text, then, when parameters were set over
/// it, a heading and one line `# set COMPONENT.KEY = VALUE` per parameter (value in JSON).
pub fn effective_config(text: &str, overrides: &BTreeMap<String, Value>) -> String {
    if overrides.is_empty() {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len() + 64 * overrides.len());
    out.push_str(text);
    if !text.is_empty() && !text.ends_with('\n') {
        out.push('\n');
    }
    out.push('\n');
    out.push_str(OVERRIDES_HEADING);
    out.push('\n');
    for (key, value) in overrides {
        out.push_str(&format!("# set {key} = {value}\n"));
    }
    out
}

/// The provenance of a run configured from the system file `text` with `overrides`, its
/// components configured with `params`, repeating run `repeat_of` if it does.
pub fn run_provenance(
    text: &str,
    overrides: BTreeMap<String, Value>,
    params: BTreeMap<String, Value>,
    repeat_of: Option<u32>,
) -> RunProvenance {
    RunProvenance {
        system_digest: sha256_hex(text.as_bytes()),
        effective_digest: sha256_hex(effective_config(text, &overrides).as_bytes()),
        overrides,
        params,
        repeat_of,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_effective_digest_is_the_system_digest_until_a_parameter_is_set() {
        let text = "[system]\nname = 'x'";
        let plain = run_provenance(text, BTreeMap::new(), BTreeMap::new(), None);
        assert_eq!(plain.system_digest, sha256_hex(text.as_bytes()));
        assert_eq!(plain.effective_digest, plain.system_digest);
        let set = BTreeMap::from([("a.b".to_owned(), json!("v")), ("a.c.d".to_owned(), json!(2.5))]);
        let changed = run_provenance(text, set.clone(), BTreeMap::new(), Some(3));
        assert_eq!(changed.system_digest, plain.system_digest, "the file's digest names the file alone");
        assert_ne!(changed.effective_digest, plain.system_digest);
        assert_eq!(
            effective_config(text, &set),
            format!("{text}\n\n{OVERRIDES_HEADING}\n# set a.b = \"v\"\n# set a.c.d = 2.5\n")
        );
        assert_eq!(changed.repeat_of, Some(3));
    }
}
