"""What a test needs from outside the repository, asked for in one way.

A test that needs a tool (a compiler, llvm-pdbutil), a shared library (libipt), a
Python package (unicorn, kdmp-parser) or a downloaded file (pywin32's win32 wheel)
asks for it here, in the test or the fixture that uses it, never for a whole
module.  When the thing is missing the test is skipped with a reason that starts
with ``MISSING``; tests/conftest.py counts those skips, lists them, and fails the
run unless DBGEXT_ALLOW_MISSING_TOOLS=1 says the caller accepts a partial run.
.ci/run installs everything, so CI runs with none."""

import importlib
import os
import shutil

import pytest

MISSING = "missing requirement: "
ALLOW_VARIABLE = "DBGEXT_ALLOW_MISSING_TOOLS"

# Where each tool and library comes from, for the skip reason.
DEBIAN_PACKAGE = {
    "clang": "clang", "lld-link": "lld", "llvm-pdbutil": "llvm", "llvm-readobj": "llvm",
    "x86_64-w64-mingw32-gcc": "gcc-mingw-w64-x86-64", "i686-w64-mingw32-gcc": "gcc-mingw-w64-i686",
    "libipt": "libipt2 libipt-dev",
}


def is_missing_reason(reason):
    """Whether a skip's reason says a requirement is missing."""
    return MISSING in reason


def missing_tools(*tools):
    """The tools among ``tools`` that are not on PATH."""
    return [tool for tool in tools if shutil.which(tool) is None]


def need_tool(*tools):
    """Skip the calling test unless every tool in ``tools`` is on PATH."""
    missing = missing_tools(*tools)
    if missing:
        packages = sorted({DEBIAN_PACKAGE.get(tool, tool) for tool in missing})
        pytest.skip("%stool %s (apt-get install %s)" % (MISSING, ", ".join(missing), " ".join(packages)))


def need_library(name, loaded):
    """Skip the calling test unless the shared library ``name`` was loaded (``loaded``
    is the handle, None when loading failed)."""
    if loaded is None:
        pytest.skip("%slibrary %s (apt-get install %s)" % (MISSING, name, DEBIAN_PACKAGE.get(name, name)))
    return loaded


def need_module(name, package=None):
    """The imported module ``name``; skips the calling test when it is not installed
    (``package``: its PyPI name when it differs; every one is in the test extra)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        pytest.skip("%spackage %s (pip install -e '.[test]')" % (MISSING, package or name))


def need_file(path, how):
    """``path``; skips the calling test when the file is absent (``how``: how to get it)."""
    if not os.path.exists(path):
        pytest.skip("%sfile %s (%s)" % (MISSING, path, how))
    return path
