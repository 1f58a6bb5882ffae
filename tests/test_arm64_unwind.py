"""ARM64 frames unwound as Windows' RtlVirtualUnwind unwinds them, checked against
code that really ran.

``tests/data/arm64/chain.c`` is built with clang for aarch64-pc-windows-msvc and
lld-link (no SDK: a ``/noentry`` DLL with our own ``__chkstk``), at several
optimisation levels, and run in unicorn's ARM64 mode.  The run is stopped before
*every* instruction it executes (for arguments drawn with a fixed seed): the
calls still live there — return address and sp at the ``bl``, recorded by the
emulator as it executed them — are what the unwind must yield, frame by frame.
"""

import random
import struct

import pytest

from arm64_support import BytesImage, IMAGE_BASE, Walker, build, execute, instruction_count
from dbgext.errors import UnreadableMemory
from dbgext.layouts.arm64 import CONTEXT_ARM64
from dbgext.sample.kdump_writer import pack_context
from dbgext.stacks.arm64_unwind import _where, find_entry, function_unwind, unwind_function, unwind_leaf
from dbgext.stacks.x64 import UnwindError

CONFIGS = ("O0", "O1", "O2", "Os", "O1-fp")


def _arguments(config):
    generator = random.Random("arm64-" + config)
    return [generator.randrange(1 << 20) for _ in range(3)]


def _position(walker, stopped):
    """Where frame 0 stopped: "leaf", "prologue", "epilogue" or "body"."""
    entry = find_entry(walker.table, walker.begins, stopped.registers["pc"] - IMAGE_BASE)
    if entry is None:
        return "leaf"
    unwind = function_unwind(walker.image, entry)
    start, skip, epilogue = _where(unwind, (stopped.registers["pc"] - IMAGE_BASE - entry[0]) // 4)
    return "epilogue" if epilogue else "prologue" if skip else "body"


@pytest.mark.parametrize("config", CONFIGS)
def test_at_every_executed_instruction_the_unwind_yields_exactly_the_live_calls(config):
    path = build(config)
    positions = {}
    functions = set()
    for argument in _arguments(config):
        stops = execute(path, argument=argument, stops=range(instruction_count(path, argument=argument)))
        walker = Walker(stops[0].image)
        assert walker.dropped == []
        for stopped in stops:
            walked = [(pc, sp) for pc, sp, _ in walker.walk(stopped)]
            assert walked == stopped.expected_frames(), (config, argument, stopped.executed,
                                                         [(hex(pc), hex(sp)) for pc, sp in walked],
                                                         [(hex(pc), hex(sp)) for pc, sp in stopped.expected_frames()])
            position = _position(walker, stopped)
            positions[position] = positions.get(position, 0) + 1
            functions.add(find_entry(walker.table, walker.begins, stopped.registers["pc"] - IMAGE_BASE))
    # The stops cover every function with unwind data, in prologues, epilogues and
    # bodies (and leaves where the compiler leaves them).
    assert functions - {None} == set(walker.table)
    assert positions.get("prologue", 0) > 50 and positions.get("epilogue", 0) > 50, positions
    if config != "O0":
        assert positions.get("leaf", 0) > 10, positions


def test_the_frame_chain_fallback_finds_every_caller_of_a_frame_whose_record_is_set_up():
    """Without unwind data, x29's chain gives the return addresses of all live
    calls when the stopped function has set up its frame record (with
    -fno-omit-frame-pointer every non-leaf function keeps one); the caller's sp
    it gives is a lower bound, marked frame_chain."""
    path = build("O1-fp")
    argument = _arguments("O1-fp")[0]
    stops = execute(path, argument=argument, stops=range(instruction_count(path, argument=argument)))
    with_data = Walker(stops[0].image)
    without = Walker(stops[0].image, use_unwind_data=False)
    checked = 0
    for stopped in stops:
        if _position(with_data, stopped) != "body":
            continue
        frames = without.walk(stopped)
        assert [pc for pc, _, _ in frames[1:]] == [pc for pc, _ in stopped.calls]
        assert all(how == "frame_chain" for _, _, how in frames[1:])
        assert all(sp <= expected for (_, sp, _), (_, expected) in zip(frames[1:], stopped.calls))
        checked += 1
    assert checked > 200


def test_a_scan_is_the_last_resort_and_its_frames_are_marked():
    path = build("O2")
    stopped = execute(path, argument=7, stops=[300])[0]
    stopped.registers["fp"] = 0          # no frame chain either
    frames = Walker(stopped.image, use_unwind_data=False).walk(stopped, max_frames=2)
    assert frames[1][2] == "scan"
    assert frames[1][0] in [pc for pc, _ in stopped.calls] + [stopped.registers["lr"]]


def test_a_leaf_returns_through_lr_and_refuses_a_frame_that_would_not_progress():
    step = unwind_leaf({"pc": 0x1000, "lr": 0x2000, "sp": 0x8000})
    assert (step.registers["pc"], step.registers["sp"], step.return_slot) == (0x2000, 0x8000, None)
    with pytest.raises(UnwindError) as error:
        unwind_leaf({"pc": 0x1000, "lr": 0x1000, "sp": 0x8000})
    assert error.value.kind == "unwind_no_progress"


def _xdata(codes, function_words=16, epilogue_in_header=None):
    code_bytes = bytes(codes) + b"\xe4"
    code_bytes += b"\xe3" * (-len(code_bytes) % 4)
    header = function_words | (len(code_bytes) // 4) << 27
    if epilogue_in_header is not None:
        header |= 1 << 21 | epilogue_in_header << 22
    return header.to_bytes(4, "little") + code_bytes


def _unwind_synthetic(codes, stack, registers, offset_words=8, **options):
    """Unwind a 16-instruction function at rva 0x10 of a module at 0x400000 whose
    .xdata (at 0x100) holds ``codes``, stopped ``offset_words`` instructions in,
    with ``stack`` (u64 values) at 0x8000."""
    data = bytearray(0x100) + _xdata(codes, **options)
    memory = dict((0x8000 + 8 * index, value) for index, value in enumerate(stack))
    registers = dict(registers, pc=0x400000 + 0x10 + 4 * offset_words)

    def read(address):
        if address not in memory:
            raise UnreadableMemory(address, 8)
        return memory[address]
    return unwind_function(BytesImage(bytes(data)), 0x400000, (0x10, 0x10 + 64, 0x100), registers, read)


def test_custom_stack_codes_restore_from_the_machine_frame_and_the_trap_frame():
    machine = _unwind_synthetic([0xE9], [0x9000, 0x401234], {"sp": 0x8000, "lr": 0x5})
    assert (machine.registers["sp"], machine.registers["pc"], machine.machine_frame) == (0x9000, 0x401234, 0x8000)
    stack = [0] * (0x150 // 8)
    stack[0x98 // 8], stack[0x138 // 8], stack[0x140 // 8], stack[0x148 // 8] = 0xA000, 0x777, 0xA010, 0x402000
    stack[0xA0 // 8 + 3] = 0x33
    trap = _unwind_synthetic([0xE8], stack, {"sp": 0x8000, "lr": 0x5})
    assert (trap.registers["sp"], trap.registers["pc"], trap.registers["lr"], trap.registers["fp"],
            trap.registers["x3"]) == (0xA000, 0x402000, 0x777, 0xA010, 0x33)
    cleared = _unwind_synthetic([0xEC], [], {"sp": 0x8000, "lr": 0x404444})
    assert cleared.registers["pc"] == 0x404444 and cleared.machine_frame is None
    # Each gives the pc where the caller was interrupted: the next frame is looked
    # up at that pc, not at the call before it.
    assert (machine.unwound_to_call, trap.unwound_to_call, cleared.unwound_to_call) == (False, False, False)
    assert _unwind_synthetic([0x01], [], {"sp": 0x8000, "lr": 0x404444}).unwound_to_call is True


def test_the_context_code_restores_every_register_from_the_context_record_at_sp():
    registers = dict(("x%d" % number, 0x100 + number) for number in range(29))
    registers.update(fp=0x9F00, lr=0x401111, sp=0x9F80, pc=0x402222, cpsr=0x4)
    record = pack_context(CONTEXT_ARM64, registers)
    stack = list(struct.unpack("<%dQ" % (len(record) // 8), record))
    step = _unwind_synthetic([0xEA], stack, {"sp": 0x8000, "lr": 0x5})
    assert all(step.registers[name] == value for name, value in registers.items() if name != "cpsr")
    assert step.machine_frame == 0x8000 and step.return_slot == 0x8000 + CONTEXT_ARM64["registers"]["pc"][0]


def test_save_next_extends_a_pair_save_and_is_refused_before_a_single_save():
    # prologue: stp x19,x20,[sp,#-32]!; stp x21,x22,[sp,#16] as save_r19r20_x + save_next
    step = _unwind_synthetic([0xE6, 0x24], [19, 20, 21, 22], {"sp": 0x8000, "lr": 0x401000})
    assert [step.registers["x%d" % n] for n in (19, 20, 21, 22)] == [19, 20, 21, 22]
    assert step.registers["sp"] == 0x8020
    with pytest.raises(UnwindError, match="save_next"):
        _unwind_synthetic([0xE6, 0xD0, 0x00], [1], {"sp": 0x8000, "lr": 0x401000})


def test_pac_sign_lr_strips_the_authentication_code_from_the_restored_return_address():
    # prologue: pacibsp; stp x29,lr,[sp,#-16]!  (codes in unwind order: save_fplr_x, pac_sign_lr)
    step = _unwind_synthetic([0x81, 0xFC], [0x8100, 0x0035_0000_0040_1000], {"sp": 0x8000, "lr": 0})
    assert step.registers["pc"] == 0x0000_0000_0040_1000 and step.return_slot == 0x8008


def test_inside_a_header_epilogue_only_the_codes_still_to_run_are_undone():
    # prologue: stp x29,lr,[sp,#-16]!; sub sp,sp,#32  -> epilogue (E bit, index 0) at the last 3 words:
    # add sp,sp,#32; ldp x29,lr,[sp],#16; ret
    codes = [0x02, 0x81]
    stack = [0] * 4 + [0x8500, 0x401000]
    at_add = _unwind_synthetic(codes, stack, {"sp": 0x8000, "lr": 0}, offset_words=13, epilogue_in_header=0)
    assert at_add.epilogue and (at_add.registers["sp"], at_add.registers["pc"]) == (0x8030, 0x401000)
    at_ldp = _unwind_synthetic(codes, [0x8500, 0x401000], {"sp": 0x8000, "lr": 0}, offset_words=14,
                               epilogue_in_header=0)
    assert (at_ldp.registers["sp"], at_ldp.registers["fp"], at_ldp.registers["pc"]) == (0x8010, 0x8500, 0x401000)
    at_ret = _unwind_synthetic(codes, [], {"sp": 0x8000, "lr": 0x402000}, offset_words=15, epilogue_in_header=0)
    assert (at_ret.registers["sp"], at_ret.registers["pc"]) == (0x8000, 0x402000)


def test_unreadable_stack_during_an_unwind_surfaces_with_its_address():
    def read(address):
        raise UnreadableMemory(address, 8)
    data = bytearray(0x100) + _xdata([0x81])
    with pytest.raises(UnreadableMemory) as error:
        unwind_function(BytesImage(bytes(data)), 0x400000, (0x10, 0x50, 0x100), {"pc": 0x400030, "sp": 0x8000}, read)
    assert error.value.address == 0x8000


def test_save_any_reg_restores_a_pair_at_an_offset_and_a_q_register_with_writeback():
    # e7 53 02: stp x19, x20, [sp, #32];  e7 28 80: str q8, [sp, #-16]!
    pair = _unwind_synthetic([0xE7, 0x53, 0x02], [0, 0, 0, 0, 0x1919, 0x2020], {"sp": 0x8000, "lr": 0x401000})
    assert (pair.registers["x19"], pair.registers["x20"], pair.registers["sp"]) == (0x1919, 0x2020, 0x8000)
    vector = _unwind_synthetic([0xE7, 0x28, 0x80], [0x8888, 0], {"sp": 0x8000, "lr": 0x401000})
    assert (vector.registers["q8"], vector.registers["sp"]) == (0x8888, 0x8010)
