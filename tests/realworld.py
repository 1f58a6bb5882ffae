"""The real files in ``../shared/realworld`` (beside the repository: real dumps,
traces and PDBs nobody on this project wrote, never copied into it), and a way to
run a command on them in-process."""

import io
from pathlib import Path

import pytest

from dbgext.cli import main

REALWORLD = Path(__file__).resolve().parents[1].parent / "shared" / "realworld"


def real_file(path):
    """``path`` as a string; the test fails (never skips) when the file is missing."""
    path = Path(path)
    if not path.is_file():
        pytest.fail("%s is missing: the real-world files live in ../shared/realworld" % path)
    return str(path)


def run(argv):
    """``dbgext ARGV`` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, stream=out, error_stream=err)
    return code, out.getvalue(), err.getvalue()
