"""Every ```python block of docs/python.md runs, in order, in a directory holding the files it
names (the blocks share one namespace, as a reader typing them would)."""

import re

from conftest import REPO

DOC = REPO / "docs" / "python.md"


# Sections whose examples need running processes, each run by a test of its own:
# "Control plane" by test_dialog.py.
RUN_ELSEWHERE = {"Control plane"}


def python_blocks(doc=DOC, section=None):
    """The ```python blocks of `doc`: those of its `## section`, or with no section given,
    those of every section but the ones in RUN_ELSEWHERE."""
    blocks = []
    for part in re.split(r"^## ", doc.read_text(), flags=re.M):
        title = part.split("\n", 1)[0].strip()
        if (title == section) if section else (title not in RUN_ELSEWHERE):
            blocks += re.findall(r"^```python\n(.*?)^```", part, flags=re.S | re.M)
    return blocks


def test_every_example_of_the_python_guide_runs(in_data_dir, capsys):
    blocks = python_blocks()
    assert len(blocks) >= 5
    namespace = {}
    for i, block in enumerate(blocks):
        exec(compile(block, f"{DOC}:block{i}", "exec"), namespace)
    out = capsys.readouterr().out
    assert "1 1 True" in out  # run, sequence, complete
    assert "False no trailer: the file was not closed" in out
    assert "no-such-file.daq" in out
    assert "Buffer" in out
    assert "True [0, 1]" in out and "True True" in out  # decode_event of an ET event


def test_the_readme_example_runs(in_data_dir, capsys):
    (block,) = python_blocks(REPO / "README.md")
    exec(compile(block, "README.md", "exec"), {})
    assert capsys.readouterr().out.splitlines()[0] == "True"
