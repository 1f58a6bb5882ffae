"""x86 FPO and FrameData from real MSVC PDBs (``../shared/realworld/pdb``), used
as dbghelp uses them.

* The records read from each PDB's DBI optional debug streams are the records
  ``llvm-pdbutil dump --fpo`` lists (an independent reader).
* Program strings evaluate as dbghelp's postfix language does.
* The truth: each real MSVC x86 image is executed in the emulator, every
  function from its entry with a known ESP, following its calls inside the image;
  at every function entry, every call and every return point the emulator's own
  record of the live calls is the stack, and ``k`` must give exactly those frames
  (return address and child-SP) from the stopped state with the image's PDB —
  with the image in memory, and without it (as a minidump holds the stack).
"""

import collections
import os
import re
import subprocess

import pytest

from dbgext.sample.scenario import Scenario, Thread
from dbgext.stacks import analyze
from dbgext.symbols.framedata import FrameRecord, FrameTable, ProgramError, evaluate, read_frame_table
from dbgext.symbols.match import PdbModuleSymbols
from dbgext.symbols.pdb import PdbFile

from stacks_support import REALWORLD, X86_STACK_LIMIT, X86_STACK_SIZE, execute_x86, load_x86_image
from requirements import need_tool

PDB_ROOT = os.path.join(REALWORLD, "pdb")
# Every x86 PDB of the corpus (not the CAB-compressed one) ...
X86_PDBS = [
    "msvc2003-x86-compiled2003/Compiled2003.pdb", "msvc2005-x86-native2005/native2005.pdb",
    "msvc2010-x86-breakpad-regtest/dump_syms_regtest.pdb", "msvc2010-x86-comclient/comclient.pdb",
    "msvc2010-x86-omap-reorder-funcs/omap_reorder_funcs.pdb", "msvc2010-x86-omap-stretched/omap_stretched.pdb",
    "msvc2012-x86-vs2012/vs2012.pdb", "msvc2013-x86-kmdf-driver/Native_x86_VS2013_KernelModeDriver.pdb",
    "msvc2015-x86-exe/Native_x86_VS2015_Default.pdb", "msvc2017-x86-basic32-min/basic32-min.pdb",
    "msvc2017-x86-crash/crash.pdb", "msvc2017-x86-crash-srcsrv/crash_with_srcsrv.pdb",
    "msvc2017-x86-pdbstripped/Native_x86_VS2017_15.5.4_PdbStripped.pdb", "msvc2022-x86-xcpt4/xcpt4.pdb",
]
# ... and those whose executable image is there to run.
X86_PROGRAMS = [
    ("msvc2003-x86-compiled2003", "Compiled2003.exe", "Compiled2003.pdb"),
    ("msvc2005-x86-native2005", "native2005.exe", "native2005.pdb"),
    ("msvc2010-x86-comclient", "comclient.exe", "comclient.pdb"),
    ("msvc2012-x86-vs2012", "vs2012.exe", "vs2012.pdb"),
    ("msvc2015-x86-exe", "Native_x86_VS2015_Default.exe", "Native_x86_VS2015_Default.pdb"),
    ("msvc2017-x86-crash", "crash.exe", "crash.pdb"),
    ("msvc2022-x86-xcpt4", "xcpt4.exe", "xcpt4.pdb"),
]
MAX_STOPS = 400   # per program: the first stops, functions taken in RVA order


# -- the records ----------------------------------------------------------------------------

def llvm_fpo_records(path):
    """(old FPO rows, FrameData rows) as llvm-pdbutil prints them."""
    text = subprocess.run(["llvm-pdbutil", "dump", "--fpo", path], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=120).stdout.decode("latin-1")
    old, new, rows = [], [], None
    for line in text.splitlines():
        if "Old FPO Data" in line:
            rows = old
        elif "New FPO Data" in line:
            rows = new
        elif rows is not None and re.match(r"^[0-9A-F]{8} \|", line):
            rows.append([cell.strip() for cell in line.split("|")])
    return old, new


@pytest.mark.parametrize("relative", X86_PDBS)
def test_fpo_and_framedata_records_are_the_ones_llvm_pdbutil_lists(relative):
    need_tool("llvm-pdbutil")
    path = os.path.join(PDB_ROOT, relative)
    table = read_frame_table(PdbFile(path))
    old, new = llvm_fpo_records(path)
    # RVA | Code | Locals | Params | Stack | Prolog | Saved Regs | SEH | C++EH | Start | Program
    expected = sorted((int(row[0], 16), int(row[1]), int(row[2]), int(row[3]), int(row[5]), int(row[6]),
                       row[9] == "true", " ".join(row[10].split())) for row in new)
    assert sorted((record.rva, record.size, record.locals, record.params, record.prolog,
                   record.saved_registers, record.function_start, " ".join(record.program.split()))
                  for record in table.frame_data) == expected
    # RVA | Code | Locals | Params | Prolog | Saved Regs | Use BP | Has SEH | Frame Type (dwords, as stored)
    expected = sorted((int(row[0], 16), int(row[1]), int(row[2]), int(row[3]), int(row[4]), int(row[5]))
                      for row in old if row[8] in ("FPO", "Non-FPO", "NonFPO"))
    assert sorted((record.rva, record.size, record.locals // 4, record.params // 4, record.prolog,
                   record.saved_registers // 4) for record in table.fpo) == expected
    assert len(table) == len(new) + len(expected) > 0


def test_the_innermost_record_covering_an_address_applies():
    # MSVC's nested records for one function: one from its start, one from each push.
    records = [FrameRecord(0x1000, 0x114, 0, 8, 0, 17, "start", True, "framedata"),
               FrameRecord(0x100F, 0xF5, 12, 8, 4, 2, "one push", False, "framedata"),
               FrameRecord(0x1030, 0x92, 12, 8, 8, 0, "two pushes", False, "framedata"),
               FrameRecord(0x1048, 0xA, 12, 8, 12, 0, "three pushes", False, "framedata")]
    table = FrameTable(records, [FrameRecord(0x2000, 0x10, 0, 0, 0, 0, "fpo", True, "fpo")])
    assert [table.find(rva).program for rva in (0x1000, 0x100F, 0x1040, 0x1049, 0x1060, 0x10D0, 0x1110)] == [
        "start", "one push", "two pushes", "three pushes", "two pushes", "one push", "start"]
    assert table.find(0x1114) is None and table.find(0xFFF) is None
    assert table.find(0x2008).source == "fpo" and table.find(0x2010) is None


# -- program strings --------------------------------------------------------------------------

def memory(values):
    def read(address):
        if address not in values:
            raise ProgramError("unreadable")
        return values[address]
    return read


def test_a_frame_pointer_program_gives_the_callers_eip_esp_ebp_and_saved_registers():
    program = "$T0 $ebp = $eip $T0 4 + ^ = $ebp $T0 ^ = $esp $T0 8 + =  $20 $T0 52 - ^ =  $23 $T0 56 - ^ ="
    read = memory({0x1000: 0x2000, 0x1004: 0x401234, 0x1000 - 52: 0xB, 0x1000 - 56: 0x5})
    assigned = evaluate(program, {"$ebp": 0x1000, "$esp": 0xF00}, read)
    assert assigned == {"$T0": 0x1000, "$eip": 0x401234, "$ebp": 0x2000, "$esp": 0x1008, "$ebx": 0xB, "$esi": 0x5}


def test_ra_search_is_computed_only_when_a_program_uses_it_and_align_rounds_down():
    asked = []

    def search():
        asked.append(True)
        return 0x1010
    program = "$T1 .raSearch = $T0 $T1 4 - 8 @ = $ebp $T1 4 - ^ = $eip $T1 ^ = $esp $T1 4 + ="
    assigned = evaluate(program, {".raSearch": search}, memory({0x100C: 0x3000, 0x1010: 0x401000}))
    assert assigned["$T0"] == 0x1008 and assigned["$ebp"] == 0x3000 and assigned["$esp"] == 0x1014
    assert asked == [True]
    assert evaluate("$T0 $ebp =", {"$ebp": 1, ".raSearch": search}, memory({})) == {"$T0": 1} and asked == [True]


@pytest.mark.parametrize("program", ["$T0 +", "$T0 1 0 / =", "$T0 1 3 @ =", "$T0 ^", "$T0 1", "1 2 =",
                                     "$T0 $ecx =", "$T0 bogus =", "$eip 4 ^ ="])
def test_a_program_that_cannot_be_evaluated_raises_program_error(program):
    with pytest.raises(ProgramError):
        evaluate(program, {"$ecx": None}, memory({}))


# -- executed real code -----------------------------------------------------------------------

def stops_of(folder, exe, pdb_name):
    """(target factory, the PDB, [stops with at least two live calls])."""
    root = os.path.join(PDB_ROOT, folder)
    image, data = load_x86_image(os.path.join(root, exe))
    pdb = PdbFile(os.path.join(root, pdb_name))
    procedures = sorted(pdb.procedures(), key=lambda procedure: procedure.rva)
    starts = set(procedure.rva for procedure in procedures)
    stops = []
    for procedure in procedures:
        # The outermost return address: a value in the image no call precedes
        # (the header page), so the outermost frame is not compared.
        for stop in execute_x86(image, data, procedure.rva, image.image_base + 0x10, starts):
            if len(stop.calls) >= 2:
                stops.append(stop)
        if len(stops) >= MAX_STOPS:
            break
    name = exe.rsplit(".", 1)[0]

    def target_at(stop, with_code=True):
        scenario = Scenario("x86", "user")
        scenario.add_module(name, image.image_base, len(data), image=exe, content=data)
        if not with_code:
            scenario.unmap(image.image_base, len(data))     # a minidump: stacks, no code
        scenario.write(X86_STACK_LIMIT, stop.stack)
        scenario.threads.append(Thread(1, stack_base=X86_STACK_LIMIT, stack_size=X86_STACK_SIZE,
                                       registers=stop.registers))
        target = scenario.target()
        target.symbols.add(PdbModuleSymbols(name, pdb, lambda *problem: None))
        return target
    return target_at, stops[:MAX_STOPS]


@pytest.mark.parametrize("with_code", [True, False], ids=["image-in-memory", "minidump-without-code"])
@pytest.mark.parametrize("folder,exe,pdb_name", X86_PROGRAMS)
def test_k_reproduces_every_stack_an_executed_msvc_x86_image_had(folder, exe, pdb_name, with_code):
    # Without the code (a minidump) the PDB still tells a return address from a
    # pointer to data: it must lie inside a function the PDB describes.
    target_at, stops = stops_of(folder, exe, pdb_name)
    assert len(stops) >= 40
    found_by = collections.Counter()
    for stop in stops:
        expected = stop.expected_frames()[:-1]          # the planted outermost return is no frame
        result = analyze(target_at(stop, with_code))
        assert [(frame.ip, frame.child_sp) for frame in result.frames[:len(expected)]] == expected, (
            "stopped at %s" % result.frames[0].function)
        found_by.update(frame.found_by for frame in result.frames[1:len(expected)])
        assert not with_code or not any(frame.unconfirmed for frame in result.frames[:len(expected)])
    assert found_by["scan"] == 0
    assert found_by["unwind"] > 0      # FPO/FrameData, the EBP chain where no record applies


# -- bad input ----------------------------------------------------------------------------------

class GarbledPdb(object):
    """A PDB whose FPO, FrameData and info streams are random bytes."""

    def __init__(self, generator):
        self.path = "garbled.pdb"
        self.streams = dict((index, bytes(generator.getrandbits(8) for _ in range(generator.randrange(0, 200))))
                            for index in (0, 1, 9))
        self.msf = self

    def debug_stream(self, index, what):
        return self.streams[index]

    def source_rva(self, rva):
        return rva

    def stream(self, index, what):
        return self.streams[1]

    def procedures(self):
        return []

    def publics(self):
        return []

    # The real parsers of the info stream's named stream map, over the garbled bytes.
    string_table = PdbFile.string_table
    fail = PdbFile.fail


def test_garbled_frame_data_streams_raise_pdb_error_or_read_never_anything_else():
    import random

    from dbgext.symbols.pdb import PdbError

    generator = random.Random(28)
    for _ in range(300):
        try:
            table = read_frame_table(GarbledPdb(generator))
        except PdbError:
            continue
        for record in table.frame_data + table.fpo:
            assert isinstance(record.program, str)


def test_garbled_program_strings_raise_program_error_only():
    import random

    generator = random.Random(28)
    tokens = ["$T0", "$T1", "$eip", "$esp", "$ebp", "$20", ".raSearch", ".cbLocals", "4", "-8", "0", "+", "-", "*",
              "/", "%", "@", "^", "=", "x", "0x10"]
    values = {"$esp": 0x1000, "$ebp": 0x2000, "$eip": 0x401000, ".raSearch": 0x1010, ".cbLocals": 8}
    for _ in range(2000):
        program = " ".join(generator.choice(tokens) for _ in range(generator.randrange(1, 12)))
        try:
            evaluate(program, dict(values), memory({0x1000: 1, 0x1010: 0x401234, 0x2000: 0x3000}))
        except ProgramError:
            pass
