#!/usr/bin/env bash
# Builds every fuzz target and runs each for SECONDS (default 20) from a scratch copy of the
# seed corpus (the repository's corpus is never modified). Fails if any target crashes,
# leaving the crashing input under $FUZZ_OUT (default: a temporary directory) and printing
# its path. Needs cargo-fuzz (`cargo install cargo-fuzz --locked`); the targets need nightly
# features, which RUSTC_BOOTSTRAP=1 allows for this crate's build only. See docs/fuzzing.md.
#
#   fuzz/run.sh            # every target, 20 s each
#   fuzz/run.sh 300 http   # one target, 5 minutes
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-20}"
shift || true
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz/run.sh: cargo-fuzz is missing: cargo install cargo-fuzz --locked" >&2
  exit 2
fi
# Its own target directory: the instrumented build shares nothing with the workspace's.
export CARGO_TARGET_DIR="$PWD/target"
targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
  mapfile -t targets < <(cargo fuzz list)
fi
out="${FUZZ_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/daqflow-fuzz.XXXXXX")}"
mkdir -p "$out"

echo "== fuzz: building ${#targets[@]} targets"
start=$(date +%s)
RUSTC_BOOTSTRAP=1 cargo fuzz build
echo "== fuzz: built in $(( $(date +%s) - start )) s"
triple="$(rustc -vV | sed -n 's/^host: //p')"

failed=()
for t in "${targets[@]}"; do
  corpus="$out/corpus/$t"
  artifacts="$out/artifacts/$t/"
  mkdir -p "$corpus" "$artifacts"
  if [ -d "corpus/$t" ]; then
    cp -R "corpus/$t/." "$corpus/"
  fi
  log="$out/$t.log"
  # -timeout: an input that takes longer than 10 s is a hang; -rss_limit_mb: one that makes a
  # decoder allocate more than 2 GiB is a crash (libFuzzer's defaults, said explicitly).
  if "target/$triple/release/$t" "$corpus" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -artifact_prefix="$artifacts" -print_final_stats=1 >"$log" 2>&1; then
    echo "== fuzz: $t: $(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$') runs in ${seconds} s, no crash"
  else
    echo "!! fuzz: $t crashed; input in $artifacts, log $log:"
    grep -E -A30 'panicked|ERROR: (libFuzzer|AddressSanitizer)|SUMMARY' "$log" | head -60 || tail -40 "$log"
    failed+=("$t")
  fi
done
if [ "${#failed[@]}" -gt 0 ]; then
  echo "!! fuzz: crashes in ${failed[*]} (reproduce: cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run TARGET FILE)"
  exit 1
fi
[ -n "${FUZZ_OUT:-}" ] || rm -rf "$out"
echo "== fuzz: ${#targets[@]} targets, ${seconds} s each, no crash"
