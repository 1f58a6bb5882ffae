"""``k`` on ARM64: dbgext's stack walker over ARM64 code that really ran.

``tests/data/arm64/chain.c`` is built with clang for aarch64-pc-windows-msvc and
lld-link at several optimisation levels and run in unicorn's ARM64 mode from
``run``; the run is stopped at instructions drawn with a fixed seed.  The stopped
machine (the DLL mapped with its headers, the stack, the context) becomes an ARM64
target, and the walk must give the calls the emulator recorded live — return
address and sp at each ``bl`` — frame for frame, every one from unwind data.
``run`` is entered with lr = ``RETURN_TO`` (in no module), so every walk ends
there with a note saying so.
"""

import io
import json
import random
import struct

import pytest

from arm64_support import (IMAGE_BASE, RETURN_TO, STACK_LIMIT, STACK_SIZE, build, execute, image_bytes,
                           instruction_count, scenario)
from dbgext.cli import main
from dbgext.disasm import Disassembler
from dbgext.layouts.arm64 import KTRAP_FRAME_ARM64
from dbgext.pe import DIRECTORY_EXCEPTION, PEImage
from dbgext.stacks import analyze
from dbgext.stacks.arm64_unwind import find_entry
from dbgext.stacks.images import runtime_functions

CONFIGS = ("O0", "O1", "O2", "Os", "O1-fp")
STOPS_PER_CONFIG = 240


def _seeded_stops(config, path):
    """Stops spread over two runs, drawn with a fixed seed."""
    generator = random.Random("arm64-k-" + config)
    stops = []
    for argument in (generator.randrange(1 << 20), generator.randrange(1 << 20)):
        count = instruction_count(path, argument=argument)
        chosen = sorted(generator.sample(range(count), STOPS_PER_CONFIG // 2))
        stops.extend(execute(path, argument=argument, stops=chosen))
    return stops


def _frames(result):
    return [(frame.ip, frame.child_sp) for frame in result.frames]


def _ended_outside_modules(result):
    """The walk's only problem is its end: the return to RETURN_TO, in no module."""
    return [(problem.kind, problem.address) for problem in result.problems] == [("outside_modules", RETURN_TO)]


@pytest.mark.parametrize("config", CONFIGS)
def test_k_at_seeded_stops_gives_exactly_the_live_calls_all_from_unwind_data(config):
    path = build(config)
    leaves = 0
    for stopped in _seeded_stops(config, path):
        result = analyze(scenario(stopped, path).target())
        where = (config, stopped.executed)
        assert result.arch == "arm64"
        assert _frames(result) == stopped.expected_frames(), where
        assert [frame.found_by for frame in result.frames] == ["context"] + ["unwind"] * len(stopped.calls), where
        assert [frame.return_address for frame in result.frames[:-1]] == [pc for pc, _ in stopped.calls], where
        assert all(not frame.unconfirmed for frame in result.frames), where
        assert _ended_outside_modules(result), (where, [str(problem) for problem in result.problems])
        leaves += result.frames[0].return_slot is None     # lr held frame 0's return address
    assert leaves > 0


def test_a_leaf_without_pdata_returns_through_lr_and_keeps_sp():
    path = build("O2")
    table = runtime_functions(PEImage.from_file(path))
    begins = [begin for begin, _, _ in table]
    for stopped in _seeded_stops("O2", path):
        if find_entry(table, begins, stopped.registers["pc"] - IMAGE_BASE) is None and stopped.calls:
            break
    else:
        raise AssertionError("no stop landed in a leaf")
    result = analyze(scenario(stopped, path).target())
    assert result.frames[0].return_address == stopped.registers["lr"]
    assert result.frames[1].child_sp == result.frames[0].child_sp       # a leaf does not move sp
    assert result.frames[1].memory == 0 and result.frames[1].found_by == "unwind"


def _without_pdata(path):
    """The DLL's mapped bytes with its exception directory emptied."""
    data = bytearray(image_bytes(path))
    pe = struct.unpack_from("<I", data, 0x3C)[0]
    struct.pack_into("<II", data, pe + 24 + 112 + 8 * DIRECTORY_EXCEPTION, 0, 0)
    return bytes(data)


def _target_without_pdata(stopped, path):
    machine = scenario(stopped, path)
    machine.write(IMAGE_BASE, _without_pdata(path))
    return machine.target()


def test_without_unwind_data_the_x29_chain_gives_every_caller_and_says_so():
    # -fno-omit-frame-pointer: every non-leaf function keeps a frame record.  The
    # chain's last return address, RETURN_TO, is in no module: it is not taken.
    path = build("O1-fp")
    checked = 0
    for stopped in _seeded_stops("O1-fp", path):
        result = analyze(_target_without_pdata(stopped, path))
        if [frame.found_by for frame in result.frames[1:]] != ["frame_chain"] * (len(stopped.calls) - 1):
            continue        # stopped before its frame record was set up (or after it was released)
        assert [frame.ip for frame in result.frames[1:]] == [pc for pc, _ in stopped.calls[:-1]]
        # The chain gives the caller's sp as just above the record: a lower bound.
        assert all(frame.child_sp <= sp for frame, (_, sp) in zip(result.frames[1:], stopped.calls))
        problems = list(result.problems)
        assert [problem.kind for problem in problems] == ["no_return_address", "no_unwind_data"]
        assert "no unwind data for chain.dll" in problems[1].message
        checked += 1
    assert checked > 20


def test_with_neither_unwind_data_nor_a_frame_chain_a_scan_finds_a_caller_marked_scan():
    path = build("O2")
    stopped = next(stop for stop in _seeded_stops("O2", path) if len(stop.calls) >= 3)
    stopped.registers["fp"] = 0
    result = analyze(_target_without_pdata(stopped, path), max_frames=2)
    assert result.frames[1].found_by == "scan"
    assert result.frames[1].ip in [pc for pc, _ in stopped.calls]
    assert "scan" in json.dumps(result.as_dict()["found_by"])


def test_the_image_path_supplies_unwind_data_the_target_lacks():
    # A minidump holds no code: the walk takes .pdata/.xdata from the image file.
    path = build("O1")
    stopped = _seeded_stops("O1", path)[-1]
    machine = scenario(stopped, path)
    machine.unmap(IMAGE_BASE, len(image_bytes(path)))
    without_code = machine.target()
    assert _frames(analyze(without_code)) != stopped.expected_frames() or not stopped.calls

    def loader(module):
        return PEImage.from_file(path, module.name)
    result = analyze(without_code, image_loader=loader)
    assert _frames(result) == stopped.expected_frames()
    assert set(frame.found_by for frame in result.frames[1:]) <= {"unwind"}


def test_k_shows_child_sp_retaddr_and_call_site_as_on_x64():
    path = build("O1")
    stopped = max(_seeded_stops("O1", path), key=lambda stop: len(stop.calls))
    target = scenario(stopped, path).target()
    out, err = io.StringIO(), io.StringIO()
    assert main(["k", "--frame-sizes"], stream=out, error_stream=err, target=target) == 0
    lines = out.getvalue().splitlines()
    assert lines[1].split() == ["#", "Memory", "Child-SP", "RetAddr", "Call", "Site"]
    rows = [line.split() for line in lines[3:]]
    expected = stopped.expected_frames()
    assert [row[0] for row in rows] == ["%02x" % index for index in range(len(expected))]
    # Every frame but the last: Child-SP, RetAddr (the next frame's pc), Call Site.
    assert [row[-3:-1] for row in rows[:-1]] == [[_windbg(sp), _windbg(pc)] for (_, sp), (pc, _) in
                                                 zip(expected, expected[1:])]
    assert all(row[-1].startswith("chain") for row in rows[:-1]) and rows[-2][-1].startswith("chain!run+")
    assert rows[-1][-2:] == [_windbg(expected[-1][1]), "0x%x" % RETURN_TO]     # no RetAddr
    assert [row[1] for row in rows[1:]] == ["%x" % (b[1] - a[1]) for a, b in zip(expected, expected[1:])]
    assert "in no loaded module" in err.getvalue()
    out = io.StringIO()
    assert main(["k", "--json"], stream=out, error_stream=io.StringIO(), target=target) == 0
    document = json.loads(out.getvalue())
    assert document["found_by"] == {"context": 1, "unwind": len(expected) - 1, "frame_chain": 0, "scan": 0}


def _windbg(address):
    return "%08x`%08x" % (address >> 32, address & 0xFFFFFFFF)


def test_a_stack_cut_short_in_the_dump_is_reported_with_its_address():
    path = build("O1")
    stopped = max(_seeded_stops("O1", path), key=lambda stop: len(stop.calls))
    machine = scenario(stopped, path)
    top_page = (STACK_LIMIT + STACK_SIZE - 1) & ~0xFFF
    machine.unmap(top_page, 0x1000)
    result = analyze(machine.target())
    unreadable = [problem for problem in result.problems if problem.kind == "stack_unreadable"]
    assert len(unreadable) == 1 and top_page <= unreadable[0].address < top_page + 0x1000
    assert _frames(result) == [frame for frame in stopped.expected_frames() if frame[1] < top_page][
        :len(result.frames)]


# -- a trap: the faulting frame ----------------------------------------------------------------

TRAP_EXPORTS = ("run", "trap_stub", "many_saved")


def _trapped_stops(config):
    """Stops while trap_stub (tests/data/arm64/trap.s) handles a trap delivered on
    many_saved's first instruction, up to its epilogue (what follows resumes the
    interrupted code from the trap frame, as the kernel does with interrupts
    disabled, and has no unwind data of its own)."""
    path = build(config, exports=TRAP_EXPORTS, assembly=("trap.s",))
    image = PEImage.from_file(path)
    exports = dict((name, IMAGE_BASE + rva) for rva, name in image.exports.items())
    stub_end = next(IMAGE_BASE + end for begin, end, _ in runtime_functions(image)
                    if IMAGE_BASE + begin == exports["trap_stub"])
    epilogue = next(address for address, _, mnemonic, _ in Disassembler("arm64").decode(
        image.read(exports["trap_stub"] - IMAGE_BASE, stub_end - exports["trap_stub"]), exports["trap_stub"])
        if mnemonic == "ldp")
    argument = random.Random("arm64-trap-" + config).randrange(1 << 20)
    stops = execute(path, argument=argument, trap_at="many_saved",
                    stops=range(instruction_count(path, argument=argument) + 400))
    live = [stop for stop in stops if any(pc == exports["many_saved"] for pc, _ in stop.calls)
            and not epilogue <= stop.registers["pc"] < stub_end]
    return path, exports, live


def _trap_frame_address(interrupted_sp):
    """Where the emulator put the KTRAP_FRAME (as arm64_support.execute does)."""
    return ((interrupted_sp & ~0xF) - KTRAP_FRAME_ARM64["size"]) & ~0xF


@pytest.mark.parametrize("config", ["O1", "O2"])
def test_a_trap_frame_is_crossed_into_the_interrupted_function_at_its_first_instruction(config):
    path, exports, stops = _trapped_stops(config)
    assert len(stops) > 100
    for stopped in stops:
        result = analyze(scenario(stopped, path).target())
        where = (config, stopped.executed, hex(stopped.registers["pc"]))
        assert _frames(result) == stopped.expected_frames(), where
        assert set(frame.found_by for frame in result.frames[1:]) == {"unwind"}, where
        # The interrupted pc is not a return address: the frame after the trap is
        # many_saved's own first instruction, not the call before it.
        interrupted = [pc for pc, _ in stopped.calls].index(exports["many_saved"]) + 1
        stub = result.frames[interrupted - 1]
        assert stub.function.startswith("chain!trap_stub"), where
        assert stub.machine_frame == _trap_frame_address(stopped.expected_frames()[interrupted][1]), where
        assert result.frames[interrupted].function == "chain!many_saved", where


def _a_stop_inside_the_interrupted_function():
    """(image path, a stop halfway through the -O1 trap run, its expected frames, the
    index of the interrupted ``many_saved`` frame, the trap frame's address)."""
    path, exports, stops = _trapped_stops("O1")
    stopped = stops[len(stops) // 2]
    expected = stopped.expected_frames()
    interrupted = [pc for pc, _ in expected].index(exports["many_saved"])
    return path, stopped, expected, interrupted, _trap_frame_address(expected[interrupted][1])


def test_k_from_the_trap_frame_starts_at_the_faulting_instruction():
    path, stopped, expected, interrupted, trap_frame = _a_stop_inside_the_interrupted_function()
    target = scenario(stopped, path).target()
    out = io.StringIO()
    assert main(["k", "--trap", "0x%x" % trap_frame, "--json"], stream=out, error_stream=io.StringIO(),
                target=target) == 0
    document = json.loads(out.getvalue())
    assert [(frame["ip"], frame["child_sp"]) for frame in document["frames"]] == expected[interrupted:]
    out = io.StringIO()
    assert main(["k", "-v"], stream=out, error_stream=io.StringIO(), target=target) == 0
    assert "(machine frame @ %s)" % _windbg(trap_frame) in out.getvalue()


def test_kv_on_a_kernel_target_names_the_trap_frame_the_walk_crossed():
    path, stopped, expected, interrupted, trap_frame = _a_stop_inside_the_interrupted_function()
    machine = scenario(stopped, path)
    machine.mode = "kernel"         # the same memory, read as a kernel target's
    result = analyze(machine.target())
    assert [frame.trap_frame for frame in result.frames] == [
        trap_frame if index == interrupted - 1 else None for index in range(len(result.frames))]
    out = io.StringIO()
    assert main(["k", "-v"], stream=out, error_stream=io.StringIO(), target=machine.target()) == 0
    assert "(TrapFrame @ %s)" % _windbg(trap_frame) in out.getvalue()


def test_a_pdata_entry_whose_xdata_lies_outside_the_image_is_reported_and_its_function_is_not_taken_for_a_leaf():
    path = build("O1")
    image = PEImage.from_file(path)
    table = runtime_functions(image)
    begins = [begin for begin, _, _ in table]

    def entries(stop):
        return [find_entry(table, begins, pc - IMAGE_BASE) for pc in (stop.registers["pc"], stop.calls[0][0] - 4)]
    # Frame 0 in a function with unwind data, frame 1 in another.
    stopped = next(stop for stop in _seeded_stops("O1", path) if len(stop.calls) >= 3 and entries(stop)[0]
                   and entries(stop)[0] != entries(stop)[1])
    # Break the .pdata entry of frame 1's function: its word now names .xdata past the image.
    entry = find_entry(table, begins, stopped.calls[0][0] - 4 - IMAGE_BASE)
    pdata_rva, pdata_size = image.directory(DIRECTORY_EXCEPTION)
    index = [begin for begin, _ in struct.iter_unpack("<II", image.read(pdata_rva, pdata_size))].index(entry[0])
    machine = scenario(stopped, path)
    machine.pack(IMAGE_BASE + pdata_rva + 8 * index + 4, "<I", 0x7FFFFFF0)
    result = analyze(machine.target())
    problems = [problem for problem in result.problems if problem.kind == "pdata_entry_unreadable"]
    assert len(problems) == 1 and problems[0].address == IMAGE_BASE + entry[0]
    assert "outside the image" in problems[0].message
    expected = stopped.expected_frames()
    assert _frames(result)[:2] == expected[:2]
    # Frame 1's function lost its entry: not unwound as a leaf (its lr is long
    # stale) but by a scan, which finds the return address it saved.
    assert (result.frames[2].found_by, result.frames[2].ip) == ("scan", expected[2][0])


def test_random_damage_to_the_unwind_data_and_the_stack_never_raises_and_stays_bounded():
    path = build("O2")
    image = PEImage.from_file(path)
    # .pdata, and .rdata where lld puts the .xdata records.
    damaged_ranges = [(section.rva, section.size) for section in image.sections
                      if section.name in (".pdata", ".rdata")]
    assert len(damaged_ranges) == 2
    stops = _seeded_stops("O2", path)
    generator = random.Random("arm64-damage")
    kinds = set()
    for attempt in range(60):
        stopped = generator.choice(stops)
        machine = scenario(stopped, path)
        for _ in range(generator.randrange(1, 6)):
            rva, size = generator.choice(damaged_ranges)
            machine.write(IMAGE_BASE + rva + generator.randrange(size), bytes([generator.randrange(256)]))
        for _ in range(generator.randrange(0, 4)):
            slot = stopped.registers["sp"] + 8 * generator.randrange(64)
            if slot + 8 <= STACK_LIMIT + STACK_SIZE:
                machine.write(slot, generator.getrandbits(64).to_bytes(8, "little"))
        result = analyze(machine.target(), max_frames=64)
        assert 1 <= len(result.frames) <= 64, attempt
        kinds.update(problem.kind for problem in result.problems)
    # The damage was noticed: entries dropped or impossible, codes refused, walks cut short.
    assert {"pdata_corrupt", "pdata_entry_unreadable", "unwind_info_corrupt", "stack_unreadable"} <= kinds, kinds
