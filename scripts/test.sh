#!/usr/bin/env bash
# The test suite, as README.md gives it: under the default python3 and under
# Python 3.8 (the oldest CPython pykd runs on inside WinDbg), each in its own venv
# with the test extra (pytest, Hypothesis, kdmp-parser, minidump, unicorn,
# volatility3) and Dask.
# Exits non-zero if either run fails, collects no tests (pytest exit code 5), or
# skips a test because a tool, library, package or file it needs is missing (the
# compilers, libipt, llvm, pywin32's win32 wheel: .ci/run installs them all);
# DBGEXT_ALLOW_MISSING_TOOLS=1 accepts such a partial run, and the summary still
# lists every test that did not run and why.
set -euo pipefail
cd "$(dirname "$0")/.."

make_venv() {
    local python=$1 venv=$2
    [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -e ".[test,dask]"
}

run_suite() {
    local venv=$1
    echo "== tests under $("$venv/bin/python" --version)"
    "$venv/bin/python" -m pytest -q -p no:cacheprovider
}

# Both venvs first: each run reads triage databases the other Python writes.
make_venv python3 .venv
PYENV_VERSION=3.8.18 make_venv python3.8 .venv38
run_suite .venv
run_suite .venv38
