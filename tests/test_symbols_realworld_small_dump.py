"""``x`` on the real x64 small memory dump (../shared/realworld/kernel/
rizin__triage_x64.dmp), which holds nt's header page but not its export table,
and no page of amdppm's image: with no PDB to be had, ``x`` lists nothing and
says why in one line, as an error — never an empty success."""

import io
import json
from pathlib import Path

import pytest

from dbgext.cli import main

REALWORLD = Path(__file__).resolve().parents[1].parent / "shared" / "realworld" / "kernel"
X64 = REALWORLD / "rizin__triage_x64.dmp"
NO_PATH = "no symbol path is set (--symbols or _NT_SYMBOL_PATH)"


def real(path):
    if not path.is_file():
        pytest.fail("%s is missing: the real-world files live in ../shared/realworld" % path)
    return str(path)


@pytest.fixture(autouse=True)
def no_symbol_path_from_the_environment(monkeypatch):
    monkeypatch.delenv("_NT_SYMBOL_PATH", raising=False)


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, stream=out, error_stream=err)
    return code, out.getvalue(), err.getvalue()


def test_x_on_nt_without_exports_or_symbol_path_is_a_one_line_error_saying_why():
    code, out, err = run(["x", "nt!*", "--dump", real(X64)])
    assert (code, out) == (1, "")
    assert err.splitlines() == ["error: x nt!*: nt: no symbols: its export table is not in the dump and " + NO_PATH]


def test_x_on_a_driver_whose_image_is_not_in_the_dump_says_so():
    code, out, err = run(["x", "amdppm!Acpi*", "--dump", real(X64)])
    assert (code, out) == (1, "")
    assert err.splitlines() == ["error: x amdppm!Acpi*: amdppm: no symbols: its image is not in the dump and "
                                + NO_PATH]


def test_x_over_every_module_groups_the_reasons_in_one_line():
    code, out, err = run(["x", "*!*", "--dump", real(X64)])
    assert (code, out) == (1, "")
    lines = err.splitlines()
    assert len(lines) == 1
    assert ("hal, kd, tm, CLFS, PSHED and 145 more modules: no symbols: its image is not in the dump and " + NO_PATH
            in lines[0])
    assert "; nt: no symbols: its export table is not in the dump" in lines[0]


def test_x_with_a_symbol_path_lacking_the_pdb_says_the_path_gives_none(tmp_path):
    code, out, err = run(["x", "nt!Ke*", "--dump", real(X64), "--symbols", str(tmp_path)])
    assert (code, out) == (1, "")
    assert err.splitlines()[-1] == ("error: x nt!Ke*: nt: no symbols: its export table is not in the dump and "
                                    "the symbol path gives no PDB for it")


def test_x_json_gives_the_reason_per_module_and_no_symbols():
    code, out, _ = run(["x", "nt!*", "--json", "--dump", real(X64)])
    document = json.loads(out)
    assert code == 0 and document["count"] == 0 and document["symbols"] == []
    assert document["modules_without_symbols"] == ["nt"]
    assert document["why_no_symbols"] == {"nt": "its export table is not in the dump and " + NO_PATH}
