"""Settings every test runs under."""

import pytest


@pytest.fixture(autouse=True)
def no_symbol_path_from_the_environment(monkeypatch):
    """A developer's _NT_SYMBOL_PATH (with a symbol server in it) must neither
    change what a test sees nor make it download."""
    monkeypatch.delenv("_NT_SYMBOL_PATH", raising=False)
    monkeypatch.delenv("_NT_ALT_SYMBOL_PATH", raising=False)
