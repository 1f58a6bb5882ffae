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
from requirements import need_file, need_module

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


# -- MSVC's own FrameData as the referee ------------------------------------------------------
#
# For every x86 function MSVC describes in a PDB, its FrameData records give the
# frame: cbLocals + cbSavedRegs (+ the saved EBP of a frame-pointer function) at
# the deepest of the function's nested records.  The real images and PDBs are in
# ../shared/realworld/pdb; stackuse reads the image (the PDB gives only the names
# and where functions start) and must find the same frame.  A function that
# allocates with alloca is "dynamic" in stackuse; its fixed part is what FrameData
# describes, and that is compared.  Counted per image: of the 1237 functions with
# FrameData in nine images, 1159 agree.  The other 78 are records that execution
# contradicts (see test_every_disagreement_with_framedata_is_a_record_execution_contradicts):
# 73 VS2003 records whose cbSavedRegs is 4 bytes short of the registers their own
# prolog pushes, 3 of the hand-written _RTC_CheckEsp and 2 of a one-`jmp`
# operator delete.  A tenth image, basic32-min.dll (FRAMEDATA_MEASURED), is counted
# but not yet explained function by function.

from dbgext.pe import PEImage  # noqa: E402
from dbgext.symbols.framedata import read_frame_table  # noqa: E402
from dbgext.symbols.pdb import PdbFile  # noqa: E402
from stacks_support import REALWORLD  # noqa: E402

PDB_ROOT = os.path.join(REALWORLD, "pdb")
FRAMEDATA_AGREEMENT = [  # (folder, image, pdb, functions agreeing, functions with FrameData)
    ("msvc2003-x86-compiled2003", "Compiled2003.exe", "Compiled2003.pdb", 640, 713),
    ("msvc2005-x86-native2005", "native2005.exe", "native2005.pdb", 51, 52),
    ("msvc2010-x86-comclient", "comclient.exe", "comclient.pdb", 46, 47),
    ("msvc2012-x86-vs2012", "vs2012.exe", "vs2012.pdb", 50, 50),
    ("msvc2013-x86-kmdf-driver", "Native_x86_VS2013_KernelModeDriver.sys", "Native_x86_VS2013_KernelModeDriver.pdb",
     39, 39),
    ("msvc2015-x86-exe", "Native_x86_VS2015_Default.exe", "Native_x86_VS2015_Default.pdb", 112, 113),
    ("msvc2017-x86-crash", "crash.exe", "crash.pdb", 89, 90),
    ("msvc2022-x86-xcpt4", "xcpt4.exe", "xcpt4.pdb", 89, 90),
    ("msvc2017-x86-pdbstripped", "Native_x86_VS2017_15.5.4_PdbStripped.dll",
     "Native_x86_VS2017_15.5.4_PdbStripped.pdb", 43, 43),
]
# Measured, not yet explained function by function: a release DLL with a stripped
# PDB (publics and a few procedures) and one clang-cl module.  Every function
# FrameData describes is found (the PDB's function publics name the ones nothing
# calls: the clang-cl module's test1..test9 among them).  Of the 46
# disagreements, 23 are records execution contradicts, where stackuse's frame is
# what the referee measures (BASIC32_EXECUTION_AGREES); the other 23 are not yet
# settled (BASIC32_UNSETTLED).
FRAMEDATA_MEASURED = [
    ("msvc2017-x86-basic32-min", "basic32-min.dll", "basic32-min.pdb", 2960, 3006),
]
# basic32-min.dll: {RVA: (FrameData's frame, the frame measured by execution)}.
# clang-cl's records (the module at 0x6be0..0x73f0) stop at `mov ebp, esp`: their
# cbSavedRegs counts the pushed EBP, which frame_bytes adds again, and the `sub
# esp, N` (or pushes) after the frame pointer is in no record — `push ebp; mov
# ebp, esp; sub esp, 8` is recorded as 8 bytes, runs 12 deep.  0x6eb0 and 0x6f30
# realign (`and esp, -8`): the measurement's minimum is the frame.  Three MSVC
# release functions (0xbaba, 0x12229, 0x4ae57) run as deep as stackuse says too.
BASIC32_EXECUTION_AGREES = {
    0x6c00: (8, 12), 0x6c20: (8, 16), 0x6c40: (12, 24), 0x6c70: (8, 4), 0x6c90: (8, 16), 0x6d30: (16, 28),
    0x6d60: (16, 28), 0x6e00: (8, 12), 0x6e50: (8, 12), 0x6e90: (8, 12), 0x6eb0: (8, 20), 0x6ee0: (8, 12),
    0x6f10: (8, 12), 0x6f30: (8, 20), 0x6f80: (12, 20), 0x6fb0: (8, 40), 0x7170: (8, 12), 0x71f0: (12, 16),
    0x7270: (8, 24), 0x72f0: (12, 32), 0xbaba: (60, 64), 0x12229: (48, 40), 0x4ae57: (24, 16),
}
# {RVA: (FrameData's frame, stackuse's)} not yet settled, with what execution
# showed: the referee's run faults in code that needs state the emulator does not
# set up (0xa333, 0xb10c, 0x123e4, 0x13b5f/0x13ba2/0x13be5, 0x1e76d, 0x2c820,
# 0x312d8, 0x327c8, 0x3bb33, 0x5119e); measures what neither says (0x14fee and
# 0x15621: 44 at the first call; 0x51344/0x51445: 156..168 — the __EH_prolog3*
# and _except1-style realigned frames; 0x53975: 44..56); reads an argument area
# in the frame (clang-cl's 0x71b0: `push esi; sub esp, 20` with two arguments
# stored at [esp], measured 8); agrees with FrameData (0x43ab2: 0); or finds the
# function's frame dynamic (0x53103, 0x53144, 0x53188, 0x531cc: the
# __CxxFrameHandler* family).
BASIC32_UNSETTLED = {
    0x71b0: (12, 28), 0xa333: (4, 0), 0xb10c: (4, 0), 0x123e4: (80, 76), 0x13b5f: (0, 24), 0x13ba2: (0, 24),
    0x13be5: (0, 24), 0x14fee: (4, 0), 0x15621: (4, 0), 0x1e76d: (16, 20), 0x2c820: (0, 4), 0x312d8: (4, 0),
    0x327c8: (680, 676), 0x3bb33: (8, 4), 0x43ab2: (0, 4), 0x5119e: (148, 12), 0x51344: (148, 12),
    0x51445: (148, 12), 0x53103: (0, 8), 0x53144: (0, 8), 0x53188: (0, 8), 0x531cc: (0, 8), 0x53975: (36, 12),
}
# VS2003's records (Compiled2003) whose cbSavedRegs is 4 bytes short of the
# callee-saved registers their own prolog pushes: `push ebp; mov ebp, esp; sub
# esp, 0xc0; push ebx; push esi; push edi` (main, 0x16d30) is recorded with
# cbSavedRegs 8, `push ebx; push esi` after an exception record (0x18720) with 4,
# a lone `push ebx` (0x1f440, 0x1f6a0) with 0.  Executed from the entry to the end
# of the record's own prolog (cbProlog bytes), the stack is 4 bytes deeper than the
# record says — by exactly what stackuse reports.
VS2003_SHORT_SAVED_REGISTERS = 73
# Records that describe no frame of the code they cover: (folder, RVA, where
# execution stops as an offset from the entry, ZF on entry, the frame found there).
FRAMEDATA_NOT_THE_CODE = [
    # _RTC_CheckEsp (hand-written): `jne fail; ret; fail: push ebp; mov ebp, esp;
    # sub esp, 0; push eax; push edx; push ebx; push esi; push edi` then the
    # arguments of its report call (at +0x11).  Its record says cbLocals 0,
    # cbSavedRegs 0; on the failure path (ZF clear) it holds 24 bytes.
    ("msvc2005-x86-native2005", 0x11EE0, 0x11, False, 24),
    ("msvc2010-x86-comclient", 0x115D0, 0x11, False, 24),
    ("msvc2015-x86-exe", 0x12040, 0x11, False, 24),
    # operator delete: one `jmp` to free (the record's 5 bytes), recorded as an
    # EBP frame (its program reads $ebp): nothing is pushed before the jump.
    ("msvc2017-x86-crash", 0x2E1F, 0, False, 0),
    ("msvc2022-x86-xcpt4", 0x6245, 0, False, 0),
]


def framedata_frames(folder, pdb_name):
    return read_frame_table(PdbFile(os.path.join(PDB_ROOT, folder, pdb_name))).function_frames()


def stackuse_frames(folder, image, pdb_name, with_pdb=True):
    result = analyze(pe=os.path.join(PDB_ROOT, folder, image),
                     pdb=os.path.join(PDB_ROOT, folder, pdb_name) if with_pdb else None)
    return dict((function.rva, function) for function in result.functions)


def fixed_frame(function):
    """stackuse's frame, or the fixed part of a dynamic (alloca) one."""
    return function.prologue_size if function.dynamic else function.frame_size


def framedata_disagreements(folder, image, pdb_name):
    """{RVA: (FrameData's frame, stackuse's)} of the functions where they differ."""
    truth = framedata_frames(folder, pdb_name)
    found = stackuse_frames(folder, image, pdb_name)
    return dict((rva, (size, fixed_frame(found[rva]) if rva in found else None))
                for rva, size in truth.items() if rva not in found or fixed_frame(found[rva]) != size)


@pytest.mark.parametrize("folder,image,pdb_name,agreeing,total", FRAMEDATA_AGREEMENT + FRAMEDATA_MEASURED)
def test_frames_agree_with_msvc_framedata(folder, image, pdb_name, agreeing, total):
    truth = framedata_frames(folder, pdb_name)
    assert len(truth) == total
    assert total - len(framedata_disagreements(folder, image, pdb_name)) == agreeing


def test_every_disagreement_with_framedata_is_a_record_execution_contradicts():
    # The referee: the function runs in unicorn (tests/stackuse_referee.py) from
    # its entry to a point where its frame is complete; the depth ESP reached is
    # stackuse's frame, and not the record's.
    need_module("unicorn")  # unicorn executes the functions
    from stackuse_referee import Referee
    not_the_code = dict(((folder, rva), (offset, zero_flag, frame))
                        for folder, rva, offset, zero_flag, frame in FRAMEDATA_NOT_THE_CODE)
    short_saves = []
    for folder, image_name, pdb_name, _, _ in FRAMEDATA_AGREEMENT:
        image = PEImage.from_file(os.path.join(PDB_ROOT, folder, image_name))
        starts = dict((record.rva, record) for record in read_frame_table(
            PdbFile(os.path.join(PDB_ROOT, folder, pdb_name))).frame_data if record.function_start)
        referee = Referee(image)
        for rva, (recorded, ours) in sorted(framedata_disagreements(folder, image_name, pdb_name).items()):
            entry = image.image_base + rva
            if (folder, rva) in not_the_code:
                offset, zero_flag, frame = not_the_code.pop((folder, rva))
                assert (referee.depth_reaching(entry, entry + offset, zero_flag), ours) == (frame, frame)
            else:
                assert folder == "msvc2003-x86-compiled2003", (folder, hex(rva), recorded, ours)
                record = starts[rva]
                assert record.uses_frame_pointer and record.saved_registers < 12
                measured = referee.depth_reaching(entry, entry + record.prolog)
                assert (measured, ours) == (recorded + 4, recorded + 4), hex(rva)
                short_saves.append(rva)
    assert not_the_code == {}
    assert len(short_saves) == VS2003_SHORT_SAVED_REGISTERS


def test_basic32_disagreements_with_framedata_are_listed_and_execution_measures_stackuses_frame():
    need_module("unicorn")  # unicorn executes the functions
    from stackuse_referee import Referee
    folder, image_name, pdb_name = FRAMEDATA_MEASURED[0][:3]
    disagreements = framedata_disagreements(folder, image_name, pdb_name)
    assert disagreements == dict(list(BASIC32_EXECUTION_AGREES.items()) + list(BASIC32_UNSETTLED.items()))
    referee = Referee(PEImage.from_file(os.path.join(PDB_ROOT, folder, image_name)))
    measured = dict((rva, (recorded, referee.measure(referee.image.image_base + rva).minimum))
                    for rva, (recorded, _) in disagreements.items() if rva in BASIC32_EXECUTION_AGREES)
    assert measured == BASIC32_EXECUTION_AGREES


def test_framedata_agreement_does_not_depend_on_how_a_function_was_found():
    # crash.exe without its PDB: functions come from calls, pointers and the gap
    # sweep; each covers the same code and gets the frame the same prologue
    # analysis gives with the PDB.  MinidumpWriteDumpCallback (0x2180) is reached
    # only through a pointer, and so are the relocated case labels of its switch:
    # taken for functions together, the switch (lower in the image) is followed
    # first, its jump table reaches them, and they are dropped as its labels.
    folder, image, pdb_name = FRAMEDATA_AGREEMENT[6][:3]
    with_pdb = stackuse_frames(folder, image, pdb_name)
    without = stackuse_frames(folder, image, pdb_name, with_pdb=False)
    common = set(rva for rva in set(with_pdb) & set(without) if with_pdb[rva].body_end == without[rva].body_end)
    assert sorted(rva for rva in set(with_pdb) & set(without) if rva not in common) == []
    assert without[0x2180].origin == "relocation"
    assert len(common) >= 80
    assert {function.origin for rva, function in without.items() if rva in common} >= {"call", "gap"}
    assert [rva for rva in sorted(common) if with_pdb[rva].frame_size != without[rva].frame_size] == []


@pytest.mark.parametrize("folder,image,pdb_name,rva,frame", [
    # push ebp; mov ebp, esp; push ecx; push 0x40890c; lea eax, [ebp - 4]: the
    # `push ecx` slot is addressed through EBP — a local, not the call's argument.
    ("msvc2022-x86-xcpt4", "xcpt4.exe", "xcpt4.pdb", 0x1050, 8),
    # ... and the same after an exception registration record (VS2003).
    ("msvc2003-x86-compiled2003", "Compiled2003.exe", "Compiled2003.pdb", 0x18230, 20),
    # push -1; push handler; mov eax, fs:[0]; push eax; sub esp, 36; cookie;
    # push ebx; push esi; push edi; push eax; lea eax, [ebp - 12]; mov fs:[0], eax:
    # thirteen instructions between the record's first push and its link.
    ("msvc2017-x86-crash", "crash.exe", "crash.pdb", 0x1420, 68),
    # push ebp; mov ebp, esp; sub esp, 0xcc; push ebx; push esi; push edi; push ecx;
    # lea edi, [ebp - 0xcc]; ...; rep stosd; pop ecx: ECX kept across the fill.
    ("msvc2005-x86-native2005", "native2005.exe", "native2005.pdb", 0x11CB0, 220),
    # mov eax, 0x3038; call <incremental-link thunk to _chkstk>.
    ("msvc2003-x86-compiled2003", "Compiled2003.exe", "Compiled2003.pdb", 0x2B9C0, 12352),
    # mov edi, edi; push ebp; mov ebp, esp; push edi; ...; jbe L; mov eax, error;
    # jmp exit; L: push esi — the save pushed only past the early exit.
    ("msvc2013-x86-kmdf-driver", "Native_x86_VS2013_KernelModeDriver.sys", "Native_x86_VS2013_KernelModeDriver.pdb",
     0x1710, 12),
])
def test_msvc_x86_prologues_framedata_describes(folder, image, pdb_name, rva, frame):
    assert framedata_frames(folder, pdb_name)[rva] == frame
    assert stackuse_frames(folder, image, pdb_name)[rva].frame_size == frame
