"""Settings every test runs under, and the rule that a run with a test skipped for
a missing tool or package fails (tests/requirements.py)."""

import os

import pytest
from hypothesis import settings

import requirements

# Property tests run the same examples on every run: a red CI run is a change's
# doing, never luck.  scripts/fuzz.py is where new inputs are tried.
settings.register_profile("dbgext", derandomize=True)
settings.load_profile("dbgext")

# (test id, reason) of every test skipped because something it needs is missing.
_MISSING = []


@pytest.fixture(autouse=True)
def no_symbol_path_from_the_environment(monkeypatch):
    """A developer's _NT_SYMBOL_PATH (with a symbol server in it) must neither
    change what a test sees nor make it download."""
    monkeypatch.delenv("_NT_SYMBOL_PATH", raising=False)
    monkeypatch.delenv("_NT_ALT_SYMBOL_PATH", raising=False)


def _skip_reason(report):
    if report.skipped and isinstance(report.longrepr, tuple):
        return report.longrepr[2]
    return None


def _record(report):
    reason = _skip_reason(report)
    if reason is not None and requirements.is_missing_reason(reason):
        _MISSING.append((report.nodeid, reason.replace("Skipped: ", "", 1)))


def pytest_runtest_logreport(report):
    _record(report)


def pytest_collectreport(report):
    _record(report)


def _allowed():
    return os.environ.get(requirements.ALLOW_VARIABLE) == "1"


def pytest_sessionfinish(session, exitstatus):
    if _MISSING and not _allowed() and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    if not _MISSING:
        return
    if _allowed():
        title = "%d skipped for a missing requirement (allowed by %s=1)" % (len(_MISSING), requirements.ALLOW_VARIABLE)
    else:
        title = ("%d skipped for a missing requirement: the run FAILS (install them, or set %s=1 "
                 "to accept a partial run)" % (len(_MISSING), requirements.ALLOW_VARIABLE))
    terminalreporter.section(title, sep="=", red=not _allowed(), yellow=_allowed())
    reasons = {}
    for nodeid, reason in _MISSING:
        reasons.setdefault(reason, []).append(nodeid)
    for reason, nodeids in sorted(reasons.items()):
        terminalreporter.write_line("%4d  %s  (e.g. %s)" % (len(nodeids), reason, nodeids[0]))




@pytest.fixture(scope="session")
def builtin_triage_plugins():
    """The triage registry with the built-in adapters alone (they register on import,
    so they are loaded once, before any test adds plug-ins)."""
    from dbgext.triage import record
    record.load_plugins()
    return dict(record._REGISTRY), set(record._LOADED_PLUGIN_MODULES)


@pytest.fixture(autouse=True)
def triage_plugins_restored(builtin_triage_plugins):
    """A test (or a module fixture) that runs triage in this process with
    ``--plugin ...`` must not leave those analyses registered: a later in-process
    triage (the demo's, say) would run them too.  After each test the registry and
    the set of loaded plug-ins go back to the built-ins."""
    yield
    from dbgext.triage import record
    registry, loaded = builtin_triage_plugins
    record._REGISTRY.clear()
    record._REGISTRY.update(registry)
    record._LOADED_PLUGIN_MODULES.clear()
    record._LOADED_PLUGIN_MODULES.update(loaded)
