"""The blocks of README.md and docs/*.md that docs/blocks.toml marks `by = "pytest"` run and print
what the manifest says (crates/cli/tests/docs.rs runs the others and checks that every block is
listed). Settings: "data-files" (the blocks of one doc in one namespace, in order, in a directory
holding the files they name, as a reader typing them would), "demo" (against a `daqflow demo`
started here), "alone" (a fresh directory); "control-plane" is test_dialog.py's."""

import re
import signal
import subprocess
import time

import pytest

from conftest import daqflow_binary
import doc_blocks


def test_every_python_block_of_the_docs_is_in_the_manifest():
    entries = {(e["doc"], e["id"]) for e in doc_blocks.manifest()}
    blocks = [b for b in doc_blocks.doc_blocks() if b.lang in doc_blocks.PYTHON]
    assert len(blocks) >= 20
    missing = [b for b in blocks if (b.doc, b.id) not in entries]
    assert not missing, (
        f"Python blocks not in docs/blocks.toml (new, or their text changed): {missing}; "
        "`cargo test -p daqflow --test docs every_block` says what to write")


def test_the_blocks_on_data_files_print_what_the_manifest_says(in_data_dir, capsys):
    pairs = doc_blocks.listed("data-files")
    assert len(pairs) >= 10
    namespaces = {}
    for block, entry in pairs:
        doc_blocks.run_python(block, entry, namespaces.setdefault(block.doc, {}))


def test_the_commands_run_alone_work_as_written(tmp_path):
    pairs = doc_blocks.listed("alone")
    assert pairs
    for i, (block, entry) in enumerate(pairs):
        assert block.lang in doc_blocks.SHELL, f"{block}: a Python block runs in a setting of its own"
        doc_blocks.run_shell(block, entry, tmp_path / f"{i:02}")


@pytest.fixture
def demo(tmp_path):
    """`daqflow demo` (the README's command) in `tmp_path`: its web UI's address; at the end
    Ctrl-C, and its last line must read `lost: 0`."""
    doc_blocks.block_dir(tmp_path)
    running = doc_blocks.Running(f"{daqflow_binary()} demo", tmp_path)
    try:
        assert running.wait_for(120, lambda out: any("run 1 started" in l for l in out)), running.tail()
        web = next(m.group(1) for l in running.output() if (m := re.search(r"web UI: (http://[0-9.:]+)/", l)))
        yield web
        running.interrupt(patience=120)
        assert running.process.returncode == 0 and "lost: 0" in running.output(), running.tail()
    finally:
        running.kill()


def test_the_blocks_against_the_demo_work_as_written(demo, tmp_path, monkeypatch, capsys):
    """In the manifest's order; Python blocks with `URL` (the demo's web UI) and `DATA` (its data
    directory, as the docs name it) given."""
    pairs = doc_blocks.listed("demo")
    assert pairs
    monkeypatch.chdir(tmp_path)
    for block, entry in pairs:
        if block.lang in doc_blocks.PYTHON:
            doc_blocks.run_python(block, entry, {"URL": demo, "DATA": "daqflow-demo"})
        else:
            doc_blocks.run_shell(block, entry, tmp_path, web=demo)
