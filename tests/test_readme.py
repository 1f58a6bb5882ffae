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
    output, errors = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(output), contextlib.redirect_stderr(errors):
        exec(compile(example, "README.md", "exec"), {})
    assert errors.getvalue() == ""                           # the library never prints
    lines = output.getvalue().splitlines()
    assert lines[0] == "1"                                   # a complete memory dump
    assert any("sampledrv!CopyLeaf" in line and "context" in line for line in lines)
    assert any(line.startswith("0xD1_sampledrv!CopyLeaf") for line in lines)


def test_a_script_opening_a_dump_with_bad_symbols_hears_of_them_only_through_problems_and_logging(
        tmp_path, monkeypatch, caplog):
    import logging

    import dbgext
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("_NT_SYMBOL_PATH", raising=False)
    assert main(["sample", "--out", "sample"], stream=io.StringIO()) == 0
    (tmp_path / "sample" / "sample.dmp.symbols" / "broken.json").write_text("{not json")
    errors = io.StringIO()
    with contextlib.redirect_stderr(errors), caplog.at_level(logging.WARNING, logger="dbgext"):
        with dbgext.open("sample/sample.dmp") as target:
            problems = [problem.message for problem in target.symbols.problems]
    assert errors.getvalue() == ""
    assert any("broken.json" in message for message in problems)
    assert any("broken.json" in record.getMessage() for record in caplog.records)
