"""The unwinder over hand-assembled images whose unwind data exercises one rule
at a time — chained entries, machine frames with an error code, frame registers,
x86 frame chains — and over bad input: corrupt .pdata, unwind chains that loop,
machine frames that loop, stack pointers outside the stack, unreadable stacks,
modules without unwind data.  Every bad input ends in a reported problem."""

import struct

import pytest

from dbgext.pe import PEImage
from dbgext.stacks import FOUND_BY, Unwinder, analyze
from dbgext.stackuse.fixtures import Function, alloc_slots, build_pe, push_slot, unwind_slot
from dbgext.target.base import Thread
from dbgext.sample.scenario import Scenario

BASE = 0xFFFFF80123400000
RBX, RBP = 3, 5
MACHFRAME = 10
SET_FPREG = 3


class Placed(object):
    """A built image in a kernel scenario plus a stack to write frames on."""

    def __init__(self, functions, arch="x64", mode="kernel", base=BASE):
        self.built = build_pe(arch, functions, image_base=base, name="drv.sys")
        self.base = base
        self.scenario = Scenario(arch, mode)
        self.scenario.add_module("drv", base, self.built.size, image="drv.sys", content=self.built.data)
        for name, rva in self.built.rvas.items():
            self.scenario.add_symbol("drv", name, rva)
        self.stack_limit = self.scenario.alloc_pages(0x6000)
        self.stack_base = self.stack_limit + 0x6000
        self.pointer = 8 if arch == "x64" else 4

    def at(self, name, offset=0):
        return self.base + self.built.rvas[name] + offset

    def put(self, address, *values):
        for index, value in enumerate(values):
            self.scenario.write_pointer(address + index * self.pointer, value)

    def walk(self, registers, bounds=False, **options):
        thread = Thread(1, registers, stack_base=self.stack_base if bounds else None,
                        stack_limit=self.stack_limit if bounds else None)
        return analyze(self.scenario.target(), thread=thread, **options)


def kinds(result):
    return [problem.kind for problem in result.problems]


# -- the rules ----------------------------------------------------------------------------------

def chained():
    """Top -> Parent, whose body continues in the split-off fragment Frag (chained
    to Parent: it runs in Parent's frame) -> Leaf."""
    return [
        Function("Top", [b"\x48\x83\xec\x28", ("call", "Parent"), b"\x48\x83\xc4\x28", b"\xc3"],
                 {"prolog_size": 4, "slots": alloc_slots(4, 0x28)}),
        Function("Parent", [b"\x53", b"\x48\x83\xec\x30", ("jmp", "Frag")],
                 {"prolog_size": 5, "slots": alloc_slots(5, 0x30) + push_slot(1, RBX)}),
        Function("Frag", [("call", "Leaf"), b"\x48\x83\xc4\x30", b"\x5b", b"\xc3"], {"chain_to": "Parent"}),
        Function("Leaf", [b"\xc3"]),
    ]


def test_a_chained_fragment_unwinds_with_its_parents_codes():
    placed = Placed(chained())
    sp0 = placed.stack_base - 0x400
    placed.put(sp0, placed.at("Frag", 5))                        # Leaf's return into Frag
    placed.put(sp0 + 8 + 0x30, 0x5B5B, placed.at("Top", 9))      # Parent's saved RBX, return into Top
    placed.put(sp0 + 8 + 0x40 + 0x28, 0)                         # Top's caller: the end
    result = placed.walk({"rip": placed.at("Leaf"), "rsp": sp0})
    assert [frame.function for frame in result.frames] == ["drv!Leaf", "drv!Frag+0x5", "drv!Top+0x9"]
    assert [frame.child_sp - sp0 for frame in result.frames] == [0, 8, 8 + 0x40]
    assert [frame.memory for frame in result.frames] == [None, 8, 0x40]
    assert list(result.problems) == []


def isr_image():
    """Isr: the processor pushed a machine frame with an error code, then Isr
    allocated 0x20 and called Leaf.  Body is where the interrupt hit."""
    return [
        Function("Body", [b"\x48\x83\xec\x28", b"\x90\x90\x90", b"\x48\x83\xc4\x28", b"\xc3"],
                 {"prolog_size": 4, "slots": alloc_slots(4, 0x28)}),
        Function("Isr", [b"\x48\x83\xec\x20", ("call", "Leaf"), b"\xcc"],
                 {"prolog_size": 4, "slots": alloc_slots(4, 0x20) + [unwind_slot(0, MACHFRAME, 1)]}),
        Function("Leaf", [b"\xc3"]),
    ]


def test_a_machine_frame_with_an_error_code_gives_the_interrupted_rip_and_rsp():
    placed = Placed(isr_image())
    interrupted_sp = placed.stack_base - 0x300
    placed.put(interrupted_sp + 0x28, 0)                        # Body's return: the end
    sp0 = placed.stack_base - 0x400
    placed.put(sp0, placed.at("Isr", 9))
    machine_frame = sp0 + 8 + 0x20 + 8                          # above the error code
    placed.put(machine_frame, placed.at("Body", 5), 0x10, 0x202, interrupted_sp, 0x18)
    result = placed.walk({"rip": placed.at("Leaf"), "rsp": sp0})
    assert [frame.function for frame in result.frames] == ["drv!Leaf", "drv!Isr+0x9", "drv!Body+0x5"]
    assert result.frames[2].child_sp == interrupted_sp
    assert result.frames[1].machine_frame == machine_frame
    assert result.frames[1].trap_frame == machine_frame - 0x168
    assert result.frames[2].memory == interrupted_sp - (sp0 + 8)  # may be anything across an interrupt


def test_a_frame_register_is_the_base_once_set_fpreg_has_run():
    # Dyn: push rbp; mov rbp, rsp (SET_FPREG rbp+0); sub rsp, rax (dynamic) -> call Leaf
    functions = [
        Function("Dyn", [b"\x55", b"\x48\x89\xe5", b"\x48\x29\xc4", ("call", "Leaf"), b"\x48\x89\xec", b"\x5d",
                         b"\xc3"],
                 {"prolog_size": 4, "frame": (RBP, 0), "slots": [unwind_slot(4, SET_FPREG)] + push_slot(1, RBP)}),
        Function("Leaf", [b"\xc3"]),
    ]
    placed = Placed(functions)
    rbp = placed.stack_base - 0x200
    sp0 = rbp - 0x1234 & ~0xF  # whatever the dynamic allocation took
    placed.put(sp0, placed.at("Dyn", 12))
    placed.put(rbp, 0xCA11E4, 0)                                # saved RBP, Dyn's return: the end
    result = placed.walk({"rip": placed.at("Leaf"), "rsp": sp0, "rbp": rbp})
    assert [frame.function for frame in result.frames] == ["drv!Leaf", "drv!Dyn+0xc"]
    assert result.frames[1].return_slot == rbp + 8
    assert list(result.problems) == []


def test_x86_frames_follow_the_ebp_chain():
    functions = [
        Function("A", [b"\x55", b"\x8b\xec", b"\x83\xec\x08", ("call", "B"), b"\xc9", b"\xc3"]),
        Function("B", [b"\x55", b"\x8b\xec", ("call", "C"), b"\x5d", b"\xc3"]),
        Function("C", [b"\xc3"]),
    ]
    placed = Placed(functions, arch="x86", mode="user", base=0x400000)
    ebp_a = placed.stack_base - 0x100
    ebp_b = ebp_a - 16
    placed.put(ebp_a, 0, 0)                                     # A's frame: the end of the chain
    placed.put(ebp_b, ebp_a, placed.at("A", 11))                # B's saved EBP, return into A
    placed.put(ebp_b - 4, placed.at("B", 8))                    # C's return into B
    result = placed.walk({"eip": placed.at("C"), "esp": ebp_b - 4, "ebp": ebp_b})
    assert [frame.function for frame in result.frames] == ["drv!C", "drv!B+0x8", "drv!A+0xb"]
    assert [frame.found_by for frame in result.frames] == ["context", "frame_chain", "frame_chain"]
    assert [frame.frame_pointer for frame in result.frames] == [ebp_b, ebp_b, ebp_a]


def x86_chain():
    """A -> B -> C on an EBP chain: (placed, registers stopped in C, A's frame, B's frame)."""
    functions = [
        Function("A", [b"\x55", b"\x8b\xec", b"\x83\xec\x08", ("call", "B"), b"\xc9", b"\xc3"]),
        Function("B", [b"\x55", b"\x8b\xec", ("call", "C"), b"\x5d", b"\xc3"]),
        Function("C", [b"\x55", b"\x8b\xec", b"\x90", b"\x5d", b"\xc3"]),
    ]
    placed = Placed(functions, arch="x86", mode="user", base=0x400000)
    ebp_a = placed.stack_base - 0x100
    ebp_b = ebp_a - 16
    ebp_c = ebp_b - 8
    placed.put(ebp_a, 0, 0)                                     # A's frame: the end of the chain
    placed.put(ebp_b, ebp_a, placed.at("A", 11))
    placed.put(ebp_c, ebp_b, placed.at("B", 8))
    return placed, {"eip": placed.at("C", 3), "esp": ebp_c, "ebp": ebp_c}, ebp_a, ebp_b


def test_an_x86_chain_without_code_in_the_dump_is_followed_unconfirmed_and_says_what_would_confirm_it():
    placed, registers, ebp_a, ebp_b = x86_chain()
    placed.scenario.unmap(placed.base, placed.built.size)        # a minidump: no code, no headers
    result = placed.walk(registers, bounds=True)
    assert [frame.function for frame in result.frames] == ["drv!C+0x3", "drv!B+0x8", "drv!A+0xb"]
    assert [frame.found_by for frame in result.frames] == ["context", "frame_chain", "frame_chain"]
    assert [frame.unconfirmed for frame in result.frames] == [False, True, True]
    assert result.frames[-1].return_address == 0                # [ebp_a + 4]: the chain's end
    assert [(problem.kind, problem.message) for problem in result.problems] == [
        ("no_unwind_data", "no code to confirm the frames of drv.sys: give --image-path or a symbol path with "
                           "the image store")]
    # The image file supplies the code: the same chain, confirmed, and nothing to report.
    loaded = placed.walk(registers, bounds=True, image_loader=lambda module: PEImage.from_bytes(placed.built.data))
    assert [frame.unconfirmed for frame in loaded.frames] == [False, False, False]
    assert [frame.found_by for frame in loaded.frames] == ["context", "frame_chain", "frame_chain"]
    assert list(loaded.problems) == []


def test_an_x86_chain_whose_return_address_follows_no_call_is_not_followed():
    placed, registers, ebp_a, ebp_b = x86_chain()
    placed.put(ebp_b + 4, placed.at("A", 3))                    # into A, but after no call
    placed.put(ebp_b + 8, placed.at("A", 11))                   # a real return address above it
    result = placed.walk(registers, bounds=True)
    assert [frame.found_by for frame in result.frames][:3] == ["context", "frame_chain", "scan"]
    assert result.frames[2].ip == placed.at("A", 11) and not result.frames[2].unconfirmed


@pytest.mark.parametrize("where", ["below_esp", "above_the_stack"])
def test_an_x86_frame_pointer_outside_the_stack_is_no_chain(where):
    placed, registers, ebp_a, ebp_b = x86_chain()
    placed.scenario.unmap(placed.base, placed.built.size)
    registers["ebp"] = registers["esp"] - 8 if where == "below_esp" else placed.stack_base - 4
    placed.put(registers["esp"] + 4, placed.at("B", 8))          # found by scanning instead
    result = placed.walk(registers, bounds=True)
    assert [frame.found_by for frame in result.frames][:2] == ["context", "scan"]
    assert result.frames[1].function == "drv!B+0x8" and result.frames[1].unconfirmed


def x64_frame_pointer_chain():
    """Outer -> Inner -> Leaf built with push rbp; mov rbp, rsp and no .pdata."""
    functions = [
        Function("Outer", [b"\x55", b"\x48\x89\xe5", ("call", "Inner"), b"\x5d", b"\xc3"]),
        Function("Inner", [b"\x55", b"\x48\x89\xe5", ("call", "Leaf"), b"\x5d", b"\xc3"]),
        Function("Leaf", [b"\x90", b"\xc3"]),
    ]
    placed = Placed(functions, mode="user", base=0x140000000)
    rbp_outer = placed.stack_base - 0x200
    rbp_inner = rbp_outer - 0x20
    placed.put(rbp_outer, 0, 0)
    placed.put(rbp_inner, rbp_outer, placed.at("Outer", 9))
    placed.put(rbp_inner - 8, placed.at("Inner", 9))
    return placed, {"rip": placed.at("Leaf", 1), "rsp": rbp_inner - 8, "rbp": rbp_inner}


def test_x64_without_unwind_data_follows_the_rbp_chain_before_scanning():
    placed, registers = x64_frame_pointer_chain()
    result = placed.walk(registers, bounds=True)
    # Leaf never pushed rbp: the chain starts at Inner's frame (Leaf's caller is
    # found through it as WinDbg's frame-pointer walk does).
    assert [frame.function for frame in result.frames] == ["drv!Leaf+0x1", "drv!Outer+0x9"]
    assert [frame.found_by for frame in result.frames] == ["context", "frame_chain"]
    assert [problem.kind for problem in result.problems] == ["no_unwind_data"]
    assert "no unwind data for drv.sys: give --image-path or a symbol path with the image store" in \
        result.problems[0].message


def test_a_scan_takes_a_return_address_whose_call_site_is_unreadable_as_unconfirmed_not_rejected():
    placed, registers = x64_frame_pointer_chain()
    placed.scenario.unmap(placed.base, placed.built.size)
    registers["rbp"] = 1                                         # no chain to follow
    placed.put(registers["rsp"] + 8, placed.base + 0x10)         # into the header page: never code
    result = placed.walk(registers, bounds=True)
    assert [frame.found_by for frame in result.frames][:2] == ["context", "scan"]
    assert result.frames[1].ip == placed.at("Inner", 9) and result.frames[1].unconfirmed


def test_an_epilogue_ending_in_a_jump_to_the_functions_own_start_is_an_epilogue():
    # A recursive tail call: add rsp; pop rbx; jmp Self.  Stopped on the pop, only
    # the pop and the return remain; the prologue's codes would read 0x20 too high.
    functions = [
        Function("Top", [b"\x48\x83\xec\x28", ("call", "Self"), b"\x48\x83\xc4\x28", b"\xc3"],
                 {"prolog_size": 4, "slots": alloc_slots(4, 0x28)}),
        Function("Self", [b"\x53", b"\x48\x83\xec\x20", b"\x48\x83\xc4\x20", b"\x5b", ("jmp", "Self")],
                 {"prolog_size": 5, "slots": alloc_slots(5, 0x20) + push_slot(1, RBX)}),
    ]
    placed = Placed(functions)
    sp0 = placed.stack_base - 0x400
    placed.put(sp0, 0xB0B, placed.at("Top", 9))                  # saved RBX, return into Top
    placed.put(sp0 + 0x10 + 0x28, 0)
    result = placed.walk({"rip": placed.at("Self", 9), "rsp": sp0})
    assert [frame.function for frame in result.frames] == ["drv!Self+0x9", "drv!Top+0x9"]
    assert [frame.child_sp - sp0 for frame in result.frames] == [0, 0x10]
    assert list(result.problems) == []


def test_return_address_zero_while_the_stack_above_holds_a_return_address_is_reported():
    placed = Placed(chained())
    sp0 = placed.stack_base - 0x400
    placed.put(sp0, 0)                                          # Leaf "returns" to 0 ...
    placed.put(sp0 + 0x48, placed.at("Top", 9))                 # ... but the stack goes on
    result = placed.walk({"rip": placed.at("Leaf"), "rsp": sp0}, bounds=True)
    assert len(result.frames) == 1 and result.frames[0].return_address == 0
    assert kinds(result) == ["walk_ended_early"]
    assert "drv!Top+0x9" in result.problems[0].message
    # At the real end of a stack nothing is said.
    placed.put(sp0 + 0x48, 0)
    assert kinds(placed.walk({"rip": placed.at("Leaf"), "rsp": sp0}, bounds=True)) == []


def recursion():
    return [Function("Recurse", [b"\x48\x83\xec\x28", ("call", "Recurse"), b"\x48\x83\xc4\x28", b"\xc3"],
                     {"prolog_size": 4, "slots": alloc_slots(4, 0x28)})]


def test_a_deep_stack_stops_at_max_frames_with_a_note():
    placed = Placed(recursion())
    sp0 = placed.stack_limit + 0x100
    for depth in range(100):
        placed.put(sp0 + depth * 0x30 + 0x28, placed.at("Recurse", 9))
    result = placed.walk({"rip": placed.at("Recurse", 9), "rsp": sp0}, max_frames=40)
    assert len(result.frames) == 40 and result.truncated
    assert kinds(result) == ["frames_truncated"]


def test_an_unwinder_walks_many_threads_of_one_target_and_counts_how_frames_were_found():
    placed = Placed(chained())
    sp0 = placed.stack_base - 0x400
    placed.put(sp0, placed.at("Frag", 5))
    placed.put(sp0 + 8 + 0x38, placed.at("Top", 9))
    unwinder = Unwinder(placed.scenario.target())
    first = unwinder.walk(Thread(1, {"rip": placed.at("Leaf"), "rsp": sp0}))
    second = unwinder.walk(Thread(2, {"rip": placed.at("Frag", 5), "rsp": sp0 + 8}))
    assert [frame.child_sp for frame in second.frames] == [frame.child_sp for frame in first.frames[1:]]
    assert first.found_by_counts == {"context": 1, "unwind": 2, "frame_chain": 0, "scan": 0}
    assert set(first.as_dict()["found_by"]) == set(FOUND_BY)


# -- bad input ---------------------------------------------------------------------------------

def corrupt_pdata(built, index, fields):
    """The image's bytes with .pdata entry ``index`` replaced by ``fields``."""
    image = PEImage.from_bytes(built.data)
    rva = image.directory(3)[0] + 12 * index
    data = bytearray(built.data)
    struct.pack_into("<III", data, rva, *fields)
    return bytes(data)


def test_corrupt_pdata_is_reported_and_the_frame_found_by_scanning_instead():
    functions = chained()
    placed = Placed(functions)
    parent = placed.built.rvas["Parent"]
    # Parent's entry now ends before it begins: it cannot be used.
    placed.scenario.write(BASE, corrupt_pdata(placed.built, 1, (parent, parent - 1, 0x2000)))
    sp0 = placed.stack_base - 0x400
    placed.put(sp0, placed.at("Parent", 9))                     # RIP in Parent, its return address further up
    placed.put(sp0 + 0x38, placed.at("Top", 9))
    result = placed.walk({"rip": placed.at("Parent", 9), "rsp": sp0})
    assert "pdata_corrupt" in kinds(result)
    assert result.frames[1].function == "drv!Top+0x9" and result.frames[1].found_by == "scan"


def test_unwind_data_whose_chain_loops_is_reported_and_scanned_past():
    functions = chained()
    functions[2] = Function("Frag", functions[2].body, {"chain_to": "Frag"})  # chained to itself
    placed = Placed(functions)
    sp0 = placed.stack_base - 0x400
    placed.put(sp0 + 0x38, placed.at("Top", 9))
    result = placed.walk({"rip": placed.at("Frag"), "rsp": sp0})  # at its call, before the epilogue
    assert "unwind_chain_loop" in kinds(result)
    assert result.frames[1].function == "drv!Top+0x9" and result.frames[1].found_by == "scan"


def test_a_machine_frame_leading_back_to_a_frame_already_walked_is_a_loop():
    placed = Placed(isr_image())
    sp0 = placed.stack_base - 0x400
    placed.put(sp0, placed.at("Isr", 9))
    machine_frame = sp0 + 8 + 0x20 + 8
    placed.put(machine_frame, placed.at("Isr", 9), 0x10, 0x202, sp0 + 8, 0x18)  # "interrupted" Isr itself
    result = placed.walk({"rip": placed.at("Leaf"), "rsp": sp0})
    assert kinds(result) == ["unwind_loop"]
    assert len(result.frames) == 2


def test_a_stack_pointer_outside_the_threads_stack_is_reported():
    placed = Placed(chained())
    outside = placed.stack_limit - 0x2000
    placed.scenario.map(outside, 0x1000)
    placed.put(outside, 0)
    result = placed.walk({"rip": placed.at("Leaf"), "rsp": outside}, bounds=True)
    assert kinds(result) == ["sp_outside_stack"]
    assert result.problems[0].address == outside
    assert len(result.frames) == 1


def test_a_stack_base_without_a_limit_is_no_bound():
    """A small dump's damaged KTHREAD copy can give InitialStack and no StackLimit
    (found by the fuzz harness): the walk goes on unbounded."""
    placed = Placed(chained())
    sp0 = placed.stack_base - 0x100
    thread = Thread(1, {"rip": placed.at("Leaf"), "rsp": sp0}, stack_base=placed.stack_base, stack_limit=None)
    result = analyze(placed.scenario.target(), thread=thread)
    assert "sp_outside_stack" not in kinds(result) and result.frames


def test_unwinding_out_of_the_threads_stack_stops_the_walk():
    placed = Placed(chained())
    sp0 = placed.stack_base - 0x10
    placed.put(sp0, placed.at("Frag", 5))                       # Frag's frame ends past the stack base
    placed.put(sp0 + 8 + 0x38, placed.at("Top", 9))
    result = placed.walk({"rip": placed.at("Leaf"), "rsp": sp0}, bounds=True)
    assert kinds(result) == ["sp_outside_stack"]
    assert result.problems[0].address == sp0 + 8 + 0x40
    assert len(result.frames) == 2


def test_an_unreadable_stack_is_reported_with_its_address():
    placed = Placed(chained())
    sp0 = placed.stack_base - 0x400
    placed.scenario.unmap(sp0, 8)
    result = placed.walk({"rip": placed.at("Top", 9), "rsp": sp0})
    assert kinds(result) == ["stack_unreadable"]
    assert result.problems[0].address == sp0 + 0x28
    assert len(result.frames) == 1


def test_a_module_without_unwind_data_is_walked_by_scanning_and_said_so():
    placed = Placed([Function(f.name, f.body) for f in chained()])  # no .pdata at all
    sp0 = placed.stack_base - 0x400
    placed.put(sp0 + 0x40, placed.at("Top", 9))
    result = placed.walk({"rip": placed.at("Frag", 5), "rsp": sp0})
    assert "no_unwind_data" in kinds(result)
    assert [frame.found_by for frame in result.frames[:2]] == ["context", "scan"]


def test_an_image_from_elsewhere_supplies_unwind_data_the_dump_lacks():
    placed = Placed(chained())
    pdata = PEImage.from_bytes(placed.built.data).directory(3)[0]
    placed.scenario.unmap(BASE + pdata, 1)                      # the dump lost .pdata's page
    sp0 = placed.stack_base - 0x400
    placed.put(sp0, placed.at("Frag", 5))
    placed.put(sp0 + 8 + 0x38, placed.at("Top", 9))
    registers = {"rip": placed.at("Leaf"), "rsp": sp0}
    without = placed.walk(registers)
    assert "no_unwind_data" in kinds(without)
    loaded = placed.walk(registers, image_loader=lambda module: PEImage.from_bytes(placed.built.data))
    assert [frame.found_by for frame in loaded.frames] == ["context", "unwind", "unwind"]
    assert "no_unwind_data" not in kinds(loaded)


def test_a_target_without_any_context_says_so():
    placed = Placed(chained())
    result = analyze(placed.scenario.target())
    assert result.frames == [] and kinds(result) == ["no_context"]


@pytest.mark.parametrize("rip", [0, 0x1234])
def test_an_instruction_pointer_outside_every_module_is_scanned_from(rip):
    # A call through a bad function pointer: RIP is garbage, the caller's return
    # address is at RSP.
    placed = Placed(chained())
    sp0 = placed.stack_base - 0x400
    placed.put(sp0, placed.at("Top", 9))
    result = placed.walk({"rip": rip, "rsp": sp0})
    assert [frame.found_by for frame in result.frames[:2]] == ["context", "scan"]
    assert result.frames[1].function == "drv!Top+0x9"


def test_k_trap_starts_from_the_registers_a_trap_frame_saved(tmp_path):
    import io
    import json

    from dbgext.cli import main

    placed = Placed(isr_image())
    interrupted_sp = placed.stack_base - 0x300
    placed.put(interrupted_sp + 0x28, 0)
    trap = placed.scenario.alloc(0x190)
    placed.put(trap + 0x158, 0xBB)                               # Rbp
    placed.put(trap + 0x168, placed.at("Body", 5))              # Rip
    placed.put(trap + 0x180, interrupted_sp)                    # Rsp
    out = io.StringIO()
    assert main(["k", "--trap", "0x%x" % trap, "--json"], stream=out, target=placed.scenario.target()) == 0
    document = json.loads(out.getvalue())
    assert [frame["function"] for frame in document["frames"]] == ["drv!Body+0x5"]
    assert document["frames"][0]["child_sp"] == interrupted_sp
    err = io.StringIO()
    assert main(["k", "--trap", "0x10"], stream=io.StringIO(), error_stream=err,
                target=placed.scenario.target()) == 1
    assert err.getvalue().count("\n") == 1 and "unreadable" in err.getvalue()


def test_garbage_stacks_end_in_problems_never_in_an_exception_or_an_endless_walk():
    import random

    placed = Placed(chained() + isr_image()[:2])
    target_code = [placed.at(name, offset) for name in ("Top", "Parent", "Frag", "Leaf", "Isr", "Body")
                   for offset in (0, 4, 5, 9)]
    generator = random.Random(13)
    sp0 = placed.stack_base - 0x800
    for _ in range(150):
        # Return addresses into the image, stack addresses and junk, mixed.
        values = [generator.choice([generator.choice(target_code), sp0 + generator.randrange(0, 0x800, 8),
                                    generator.getrandbits(64), 0]) for _ in range(0x100)]
        placed.scenario.write(sp0, struct.pack("<256Q", *values))
        registers = {"rip": generator.choice(target_code), "rsp": sp0 + generator.randrange(0, 0x400, 8),
                     "rbp": generator.choice(values)}
        result = placed.walk(registers, bounds=generator.random() < 0.5, max_frames=64)
        assert 1 <= len(result.frames) <= 64
        assert all(frame.found_by in FOUND_BY for frame in result.frames)
