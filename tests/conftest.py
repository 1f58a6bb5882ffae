"""Settings every test runs under."""

import pytest
from hypothesis import settings

# Property tests run the same examples on every run: a red CI run is a change's
# doing, never luck.  scripts/fuzz.py is where new inputs are tried.
settings.register_profile("dbgext", derandomize=True)
settings.load_profile("dbgext")


@pytest.fixture(autouse=True)
def no_symbol_path_from_the_environment(monkeypatch):
    """A developer's _NT_SYMBOL_PATH (with a symbol server in it) must neither
    change what a test sees nor make it download."""
    monkeypatch.delenv("_NT_SYMBOL_PATH", raising=False)
    monkeypatch.delenv("_NT_ALT_SYMBOL_PATH", raising=False)
