"""The fenced blocks of README.md and docs/*.md and their manifest, docs/blocks.toml.

crates/cli/tests/docs.rs checks that the manifest lists every block and runs the ones marked
`by = "cargo"`; the tests here run the ones marked `by = "pytest"` (what needs this package), as
the manifest's comment says: Python blocks in this process, shell commands with `bash -c`, each
checking the lines of output the manifest names.
"""

import contextlib
import hashlib
import io
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib

from conftest import REPO, daqflow_binary

MANIFEST = REPO / "docs" / "blocks.toml"
SHELL = {"sh", "bash", "shell", "console", "zsh"}
PYTHON = {"python", "py", "python3"}


class Block:
    """A fenced block: its doc, the line of its opening fence, its language and text (the lines
    between the fences, the fence's indentation removed, joined with newlines), and its id (the
    first 16 hex digits of the text's SHA-256), as crates/cli/tests/docs.rs computes them."""

    def __init__(self, doc, line, lang, text):
        self.doc, self.line, self.lang, self.text = doc, line, lang, text
        self.id = hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def first(self):
        return self.text.split("\n")[0]

    @property
    def place(self):
        return f"{self.doc}:{self.line}"

    def __repr__(self):
        return f"<{self.place} ```{self.lang} {self.first!r}>"


def parse_blocks(doc, text):
    opening = re.compile(r"^( *)(`{3,}|~{3,})\s*([^\s`]*)")
    lines = text.split("\n")
    blocks, i = [], 0
    while i < len(lines):
        m = opening.match(lines[i])
        if not m:
            i += 1
            continue
        indent, marker, lang = len(m.group(1)), m.group(2), m.group(3).lower()
        j = i + 1
        while j < len(lines):
            t = lines[j].strip()
            if len(t) >= len(marker) and set(t) == {marker[0]}:
                break
            j += 1
        body = []
        for l in lines[i + 1:j]:
            spaces = len(l) - len(l.lstrip(" "))
            body.append(l[min(spaces, indent):])
        if lang in SHELL or lang in PYTHON:
            blocks.append(Block(doc, i + 1, lang, "\n".join(body)))
        i = j + 1
    return blocks


def doc_blocks():
    """Every shell and Python block of README.md and docs/*.md."""
    docs = ["README.md"] + sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md"))
    return [b for d in docs for b in parse_blocks(d, (REPO / d).read_text())]


def manifest():
    with open(MANIFEST, "rb") as f:
        return tomllib.load(f)["block"]


def listed(setting, by="pytest"):
    """The (block, entry) pairs the manifest runs `by` in `setting`, in the manifest's order. A
    listed block not found in the docs fails: crates/cli/tests/docs.rs says what changed."""
    blocks = {(b.doc, b.id): b for b in doc_blocks()}
    out = []
    for e in manifest():
        if e.get("by") != by or e.get("setting", "alone") != setting:
            continue
        b = blocks.get((e["doc"], e["id"]))
        assert b is not None, (
            f"{e['doc']}: the block starting {e['first']!r} (id {e['id']}) has changed or is gone: "
            "`cargo test -p daqflow --test docs every_block` says what to write in docs/blocks.toml")
        out.append((b, e))
    return out


def unmet(lines, expect=(), match=()):
    """What of `expect` (texts a line must contain) and `match` (regular expressions a line must
    match) no line of `lines` has."""
    missing = [f"a line containing {e!r}" for e in expect if not any(e in l for l in lines)]
    missing += [f"a line matching {m!r}" for m in match if not any(re.search(m, l) for l in lines)]
    return missing


def run_python(block, entry, namespace):
    """Runs a Python block in `namespace` (shared by the blocks a reader types one after the
    other); its output lines, checked against the entry."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block.text, f"{REPO / block.doc}:{block.line}", "exec"), namespace)
    lines = out.getvalue().splitlines()
    sys.stdout.write(out.getvalue())
    missing = unmet(lines, entry.get("expect", ()), entry.get("match", ()))
    assert not missing, f"{block}: expected {', '.join(missing)}; it printed:\n{out.getvalue()}"
    return lines


# --- shell commands, as crates/cli/tests/docs.rs runs them --------------------------------------


def substitute(cmd, directory, web=None):
    """The command as the test runs it (docs/blocks.toml's comment lists the substitutions)."""
    cmd = cmd.replace("cargo run --release -- ", "daqflow ").replace("target/release/daqflow", "daqflow")
    cmd = re.sub(r"(^|[\s=])/(tmp|dev/shm)/",
                 lambda m: f"{m.group(1)}{directory}/{m.group(2).replace('/', '-')}/", cmd)
    if web:
        cmd = cmd.replace("http://127.0.0.1:8080", web)
    return cmd


def block_dir(directory):
    """A block's directory: the repository's python/ linked into it, tmp/ and dev-shm/ made."""
    directory = Path(directory)
    for d in ("tmp", "dev-shm"):
        (directory / d).mkdir(parents=True, exist_ok=True)
    link = directory / "python"
    if not link.exists():
        link.symlink_to(REPO / "python")
    return directory


class Running:
    """A command in its own process group, its output (stdout and stderr) collected by line."""

    def __init__(self, cmd, directory, stdin=None):
        env = {k: v for k, v in os.environ.items()
               if k not in ("DAQFLOW_TOKEN", "DAQFLOW_TOKEN_FILE", "DAQFLOW_CONTROL", "DAQFLOW_LOG")}
        # The test's daqflow binary, then this Python (with the package) first on the PATH.
        env["TMPDIR"] = str(Path(directory) / "tmp")
        env["PATH"] = os.pathsep.join([str(Path(daqflow_binary()).parent), str(Path(sys.executable).parent),
                                       env.get("PATH", "")])
        self.cmd = cmd
        self.process = subprocess.Popen(["bash", "-c", cmd], cwd=directory, env=env, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        start_new_session=True)
        self.lines = []
        threading.Thread(target=self._read, daemon=True).start()
        if stdin:
            self.process.stdin.write(stdin)
            self.process.stdin.flush()

    def _read(self):
        for line in self.process.stdout:
            self.lines.append(line)

    def output(self):
        return [l.rstrip("\n") for l in list(self.lines)]

    def tail(self):
        return "\n".join(self.output()[-40:])

    def wait_for(self, timeout, done):
        deadline = time.monotonic() + timeout
        while True:
            if done(self.output()):
                return True
            if self.process.poll() is not None:
                time.sleep(0.2)
                return done(self.output())
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)

    def interrupt(self, patience=5.0):
        """Ctrl-C: SIGINT to the command (to its group when that is the shell), then the group,
        then SIGKILL."""
        with contextlib.suppress(OSError):
            self.process.stdin.close()
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                comm = Path(f"/proc/{self.process.pid}/comm").read_text().strip()
                if comm == "bash":
                    os.killpg(self.process.pid, signal.SIGINT)
                else:
                    os.kill(self.process.pid, signal.SIGINT)
        for sig, wait in ((None, patience), (signal.SIGINT, 5.0), (signal.SIGKILL, 5.0)):
            if sig is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, sig)
            try:
                self.process.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        time.sleep(0.1)

    def kill(self):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def run_step(step, directory, web=None):
    """Runs one [[block.step]]; a command left in the background (mode "background"), or None."""
    cmd = substitute(step["cmd"], directory, web)
    mode = step.get("mode", "exit")
    expect, match = step.get("expect", ()), step.get("match", ())
    timeout = step.get("timeout", 120 if mode == "exit" else 90)
    if mode == "background":
        cmd = re.sub(r"(?<!&)&\s*$", "", cmd)
    r = Running(cmd, directory, step.get("stdin"))
    what = f"`{step['cmd']}` (run as `{cmd}`)"
    try:
        if mode == "exit":
            with contextlib.suppress(OSError):
                r.process.stdin.close()
            try:
                r.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{what}: not ended after {timeout} s; its output:\n{r.tail()}")
            time.sleep(0.1)
            missing = unmet(r.output(), expect, match)
            if r.process.returncode != step.get("status", 0):
                missing.insert(0, f"exit status {step.get('status', 0)}")
            for name, text in step.get("creates", {}).items():
                p = Path(directory) / name
                if not p.is_file() or text not in p.read_text():
                    missing.append(f"a file {name} holding {text!r}")
            assert not missing, f"{what}: exit status {r.process.returncode}; expected {', '.join(missing)}; " \
                                f"its output:\n{r.tail()}"
            return None
        if mode == "background":
            ready = [step["ready"]] if step.get("ready") else []
            assert r.wait_for(timeout, lambda out: not unmet(out, ready)), \
                f"{what}: no line containing {ready}; its output:\n{r.tail()}"
            keep, r = r, None
            return keep
        assert mode == "until", f"{what}: mode {mode!r} does not run here"
        assert r.wait_for(timeout, lambda out: not unmet(out, expect, match)), \
            f"{what}: expected {', '.join(unmet(r.output(), expect, match))}; its output:\n{r.tail()}"
        r.interrupt()
        missing = unmet(r.output(), step.get("after", ()))
        assert not missing, f"{what}: after Ctrl-C, expected {', '.join(missing)}; its output:\n{r.tail()}"
        return None
    finally:
        if r is not None:
            r.kill()


def run_shell(block, entry, directory, web=None):
    """Runs a shell block's steps in order in `directory`; what was started in the background is
    stopped at the end."""
    directory = block_dir(directory)
    for name, text in entry.get("files", {}).items():
        (directory / name).write_text(text)
    background = []
    try:
        for step in entry.get("step", []):
            r = run_step(step, directory, web)
            if r is not None:
                background.append((step, r))
        while background:
            step, r = background.pop()
            r.interrupt()
            missing = unmet(r.output(), step.get("after", ()))
            assert not missing, f"`{step['cmd']}` after Ctrl-C: expected {', '.join(missing)}; its output:\n{r.tail()}"
    except AssertionError as e:
        raise AssertionError(f"{block}: {e}") from None
    finally:
        for step, r in reversed(background):
            r.kill()
