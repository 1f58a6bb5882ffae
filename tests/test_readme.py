"""The README's scripting example runs as written, with public names only."""

import contextlib
import io
import os
import re

from dbgext.cli import main

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def _scripting_example():
    with open(README, encoding="utf-8") as handle:
        text = handle.read()
    section = text.split("## Scripting", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_scripting_example_runs_on_the_sample(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["sample", "--out", "sample"], stream=io.StringIO()) == 0
    example = _scripting_example()
    assert all(line.startswith(("import dbgext", "from dbgext import")) for line in example.splitlines()
               if line.startswith(("import", "from")))
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(compile(example, "README.md", "exec"), {})
    lines = output.getvalue().splitlines()
    assert lines[0] == "1"                                   # a complete memory dump
    assert any("sampledrv!CopyLeaf" in line and "context" in line for line in lines)
    assert any(line.startswith("0xD1_sampledrv!CopyLeaf") for line in lines)
