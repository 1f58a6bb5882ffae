"""Real MSVC-built x86 code: DLLs from pywin32's win32 wheel, against frames verified
by hand from their disassembly (no symbols: the helpers are recognised by their
code).  The wheel is not in the repository and tests never download it; CI fetches
it into a cache with

    pip download --platform win32 --python-version 3.8 --only-binary=:all: --no-deps
        pywin32==306 -d "$DBGEXT_WIN32_WHEELS"

and these tests skip with that reason when it is absent."""

import os
import zipfile

import pytest

from dbgext.stackuse import analyze
from requirements import need_file

WHEEL = "pywin32-306-cp38-cp38-win32.whl"
DIRECTORY = os.environ.get("DBGEXT_WIN32_WHEELS", os.path.join(os.path.expanduser("~"), ".cache", "dbgext-wheels"))


@pytest.fixture(scope="module")
def member(tmp_path_factory):
    path = os.path.join(DIRECTORY, WHEEL)
    need_file(path, "set DBGEXT_WIN32_WHEELS; .ci/run downloads it, see this file's docstring")
    directory = tmp_path_factory.mktemp("pywin32")

    def extract(name):
        with zipfile.ZipFile(path) as archive:
            found = [item for item in archive.namelist() if item.endswith("/" + name) or item == name][0]
            target = directory / name
            target.write_bytes(archive.read(found))
        return analyze(pe=str(target))

    return extract


def function_at(result, rva):
    return [function for function in result.functions if function.rva == rva][0]


def test_push_ecx_after_the_frame_pointer_is_a_4_byte_local(member):
    # push ebp; mov ebp, esp; push ecx; ... stmxcsr [ebp - 4]: the pushed slot is the local.
    function = function_at(member("pywintypes38.dll"), 0x36DC)
    assert (function.frame_size, function.dynamic) == (8, None)


def test_seh_prolog4_frame_and_call_site_depths(member):
    # push 0xc; push scopetable; call __SEH_prolog4 (unnamed, recognised by its code):
    # 12 bytes of locals + the helper's 36.
    function = function_at(member("pywintypes38.dll"), 0x20C1)
    assert function.frame_size == 12 + 36
    assert {site.depth for site in function.call_sites[:3]} == {48}


def test_eh_prolog3_frame(member):
    # push 0; mov eax, handler; call __EH_prolog3: no locals + the helper's 32.
    function = function_at(member("win32uiole.pyd"), 0x703B)
    assert function.frame_size == 32
    assert [site.depth for site in function.call_sites] == [32, 32]


def test_every_dll_of_the_wheel_is_analysed_without_a_traceback(member):
    result = member("win32api.pyd")
    assert len(result.functions) > 500
    sized = [function for function in result.functions if function.frame_size is not None or function.dynamic]
    assert len(sized) >= 0.95 * len(result.functions)
