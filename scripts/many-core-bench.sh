#!/usr/bin/env bash
# Issue 29's many-core rows in one bounded run: the builder threads fed from memory, the RU
# against its raw relay, ET beside Jefferson Lab's, the BU writing files, RU × BU scaling, the
# file writer alone and the recorders writing files, most important first, on a machine of 8
# cores or more.
#
#   cargo build --release && strip -o /tmp/daqflow target/release/daqflow
#   scripts/build-jlab-et.sh jlab-et-src /tmp/jlab-et        # optional: the ET comparison
#   scripts/many-core-bench.sh /tmp/daqflow /tmp/jlab-et/bin bench-many 480
#
# Arguments: the daqflow binary, Jefferson Lab's ET programs (`-` to leave that step out), the
# output directory, and a budget in seconds (default 480). A step starts only if its estimate
# fits in what is left of the budget, and is stopped when the budget ends; the log says which
# steps ran, were skipped or failed. Each step writes its suite's CSV, JSON and PNG into a
# folder of its own under the output directory, beside `machine.txt` (CPUs, kernel, memory,
# file systems) and `run.log`. With DAQFLOW_BENCH_TAR=FILE, the output directory is packed
# into FILE (tar.gz) after every step, so that a run stopped from outside keeps what it had.
# DAQFLOW_BENCH_QUICK=1 runs every step with --quick and one repetition: a check of the script
# itself in a minute or two, not figures. docs/performance.md says which machine gave which figure.
set -u
if [ $# -lt 3 ]; then
    echo "usage: $0 DAQFLOW JLAB_ET_BIN|- OUT [BUDGET_S]" >&2
    exit 2
fi
bin=$1
jlab=$2
out=$3
budget=${4:-480}
start=$(date +%s)
mkdir -p "$out"
log="$out/run.log"
: >"$log"

pack() {
    if [ -n "${DAQFLOW_BENCH_TAR:-}" ]; then
        tar czf "$DAQFLOW_BENCH_TAR.part" -C "$(dirname "$out")" "$(basename "$out")" &&
            mv "$DAQFLOW_BENCH_TAR.part" "$DAQFLOW_BENCH_TAR"
    fi
}

{
    echo "date: $(date -u +%FT%TZ)"
    echo "kernel: $(uname -srm)"
    echo "cpus: $(nproc) usable ($(grep Cpus_allowed_list /proc/self/status | tr -s '\t' ' '))"
    grep -m1 'model name' /proc/cpuinfo
    grep -c ^processor /proc/cpuinfo | sed 's/^/processors: /'
    head -3 /proc/meminfo
    echo "loadavg: $(cat /proc/loadavg)"
    df -h /dev/shm /tmp 2>&1
    "$bin" --version 2>&1
} >"$out/machine.txt" 2>&1
pack

# step NAME ESTIMATE_S COMMAND…: runs COMMAND if ESTIMATE_S fits in what is left of the budget.
step() {
    local name=$1 est=$2 used left rc
    shift 2
    used=$(($(date +%s) - start))
    left=$((budget - used))
    if [ "$est" -gt "$left" ]; then
        echo "== $name: skipped ($used s used, about $est s needed, budget $budget s)" >>"$log"
        return
    fi
    echo "== $name: start at $used s: $*" >>"$log"
    if [ -n "${DAQFLOW_BENCH_QUICK:-}" ]; then
        local a=() skip=
        for x in "$@"; do
            if [ -n "$skip" ]; then skip=; elif [ "$x" = --repetitions ]; then skip=1; else a+=("$x"); fi
        done
        set -- "${a[@]}" --quick
    fi
    timeout --signal=INT --kill-after=5 "$left" "$@" >>"$log" 2>&1
    rc=$?
    echo "== $name: exit $rc at $(($(date +%s) - start)) s" >>"$log"
    pack
}

b=$bin
step replay 90 "$b" bench evb --cases replay --repetitions 3 --out "$out/replay"
step ru 130 "$b" bench evb --cases ru,target_1ru_1bu --sizes 1024,4096,16384 --repetitions 3 --out "$out/ru"
step et-batch 40 "$b" bench et --cases batch --repetitions 3 --out "$out/et-batch"
if [ "$jlab" != "-" ]; then
    step et-jlab 100 "$b" bench et --cases jlab --jlab-et "$jlab" --repetitions 3 --out "$out/et-jlab"
fi
step bu 70 "$b" bench evb --cases bu --repetitions 1 --out "$out/bu"
step scaling 60 "$b" bench evb --cases scaling --repetitions 2 --out "$out/scaling"
step files 40 "$b" bench files --repetitions 3 --seconds 0.5 --out "$out/files"
step recorder 110 "$b" bench et --cases recorder --repetitions 1 --seconds 0.5 --out "$out/recorder"
echo "== done at $(($(date +%s) - start)) s" >>"$log"
pack
