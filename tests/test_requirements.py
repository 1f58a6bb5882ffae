"""The suite cannot go quietly green: a test skipped because a tool or package it
needs is missing fails the run, unless DBGEXT_ALLOW_MISSING_TOOLS=1 accepts a
partial run — and then the summary lists what did not run."""

import os
import shutil
import subprocess
import sys

import pytest

import requirements

HERE = os.path.dirname(os.path.abspath(__file__))

NEEDY_TESTS = '''
from requirements import need_module, need_tool


def test_that_needs_a_tool():
    need_tool("dbgext-no-such-tool")


def test_that_needs_a_package():
    need_module("dbgext_no_such_package")


def test_that_needs_nothing():
    pass
'''


def run_pytest(directory, allow):
    environment = dict(os.environ)
    environment.pop(requirements.ALLOW_VARIABLE, None)
    if allow:
        environment[requirements.ALLOW_VARIABLE] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(directory)],
                          cwd=str(directory), env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=300)


@pytest.fixture
def suite(tmp_path):
    for name in ("conftest.py", "requirements.py"):
        shutil.copy(os.path.join(HERE, name), str(tmp_path / name))
    (tmp_path / "test_needy.py").write_text(NEEDY_TESTS)
    return tmp_path


def test_a_skip_for_a_missing_tool_or_package_fails_the_run_and_names_them(suite):
    result = run_pytest(suite, allow=False)
    assert result.returncode == 1, result.stdout
    assert "1 passed, 2 skipped" in result.stdout
    assert "2 skipped for a missing requirement: the run FAILS" in result.stdout
    assert "tool dbgext-no-such-tool (apt-get install dbgext-no-such-tool)" in result.stdout
    assert "package dbgext_no_such_package" in result.stdout


def test_the_opt_out_passes_the_run_and_still_lists_what_did_not_run(suite):
    result = run_pytest(suite, allow=True)
    assert result.returncode == 0, result.stdout
    assert "2 skipped for a missing requirement (allowed by DBGEXT_ALLOW_MISSING_TOOLS=1)" in result.stdout
    assert "tool dbgext-no-such-tool" in result.stdout and "package dbgext_no_such_package" in result.stdout


def test_a_skip_for_another_reason_does_not_fail_the_run(tmp_path):
    for name in ("conftest.py", "requirements.py"):
        shutil.copy(os.path.join(HERE, name), str(tmp_path / name))
    (tmp_path / "test_other.py").write_text("import pytest\n\ndef test_x():\n    pytest.skip('not on this OS')\n")
    result = run_pytest(tmp_path, allow=False)
    assert result.returncode == 0 and "1 skipped" in result.stdout, result.stdout


def test_tests_ask_for_tools_and_packages_only_through_requirements():
    """So that every such skip has the form the run counts (and none is module-wide)."""
    offenders = []
    for name in sorted(os.listdir(HERE)):
        if not name.endswith(".py") or name in ("requirements.py", "test_requirements.py"):
            continue
        with open(os.path.join(HERE, name)) as handle:
            for number, line in enumerate(handle, 1):
                if "importorskip(" in line or "shutil.which(" in line:
                    offenders.append("%s:%d" % (name, number))
    assert offenders == []
