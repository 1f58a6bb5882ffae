"""x64 unwind data: every operation's stack effect, chained entries, and corrupt
unwind data that must be reported without stopping the rest."""

import struct

from dbgext.stackuse.fixtures import Function, alloc_slots, build_pe, push_slot, unwind_slot
from dbgext.stackuse.functions import ModuleFunctions
from dbgext.pe import PEImage
from dbgext.stacks.unwind_data import frame_from_unwind, parse_unwind_info
from dbgext.stacks.images import runtime_functions

RET = b"\xc3"


def module_of(functions, **options):
    built = build_pe("x64", functions, **options)
    return built, ModuleFunctions(PEImage.from_bytes(built.data, "test.sys"))


def by_name(built, module, name):
    return module.functions[built.image_base + built.rvas[name]]


def test_every_operation_moves_rsp_by_its_documented_amount():
    slots = (push_slot(0, 3)                                  # PUSH_NONVOL: 8
             + alloc_slots(0, 0x28)                           # ALLOC_SMALL: 0x28
             + alloc_slots(0, 0x1000)                         # ALLOC_LARGE info 0 (x8): 0x1000
             + alloc_slots(0, 0x100004)                       # ALLOC_LARGE info 1 (32-bit): 0x100004
             + [unwind_slot(0, 3, 0)]                         # SET_FPREG: 0
             + [unwind_slot(0, 4, 6), 0x10]                   # SAVE_NONVOL (+1 slot): 0
             + [unwind_slot(0, 5, 6), 0x0, 0x1]               # SAVE_NONVOL_FAR (+2 slots): 0
             + [unwind_slot(0, 8, 6), 0x2]                    # SAVE_XMM128 (+1 slot): 0
             + [unwind_slot(0, 9, 7), 0x0, 0x1]               # SAVE_XMM128_FAR (+2 slots): 0
             + [unwind_slot(0, 10, 1)])                       # PUSH_MACHFRAME with error code: 48
    built, module = module_of([Function("f", [RET], {"slots": slots, "frame": (5, 0x20)})])
    info = parse_unwind_info(module.image, runtime_functions(module.image)[0][2])
    assert info.problem is None
    assert [code.stack_bytes for code in info.codes] == [8, 0x28, 0x1000, 0x100004, 0, 0, 0, 0, 0, 48]
    assert info.frame_register == 5 and info.frame_offset == 0x20
    assert by_name(built, module, "f").unwind_size == 8 + 0x28 + 0x1000 + 0x100004 + 48


def test_machine_frame_without_error_code_is_40_bytes():
    built, module = module_of([Function("isr", [RET], {"slots": [unwind_slot(0, 10, 0)]})])
    assert by_name(built, module, "isr").unwind_size == 40


def test_version_2_epilog_codes_do_not_move_rsp():
    slots = [unwind_slot(1, 6, 1), unwind_slot(0, 6, 0)] + alloc_slots(4, 0x38)
    built, module = module_of([Function("f", [b"\x48\x83\xec\x38", b"\x48\x83\xc4\x38", RET],
                                        {"version": 2, "prolog_size": 4, "slots": slots})])
    function = by_name(built, module, "f")
    module.compute_frame(function)
    assert (function.unwind_size, function.prologue_size, function.source) == (0x38, 0x38, "both")


def test_chained_fragment_takes_its_parents_frame():
    parent = Function("parent", [b"\x53", b"\x48\x83\xec\x20", ("jmp", "cold"), RET],
                      {"prolog_size": 5, "slots": alloc_slots(5, 0x20) + push_slot(1, 3)})
    cold = Function("cold", [b"\x48\x83\xc4\x20", b"\x5b", RET], {"chain_to": "parent"}, export=False)
    built, module = module_of([parent, cold])
    fragment = by_name(built, module, "cold")
    assert fragment.unwind_size == 0x28
    assert fragment.fragment_of == built.image_base + built.rvas["parent"]
    module.compute_frame(fragment)
    assert (fragment.source, fragment.disagreement) == ("unwind", None)


def test_unwind_chain_that_loops_is_reported_and_the_rest_still_analysed():
    looping = Function("looping", [RET], {"chain_to": "looping"})
    fine = Function("fine", [b"\x48\x83\xec\x28", b"\x48\x83\xc4\x28", RET],
                    {"prolog_size": 4, "slots": alloc_slots(4, 0x28)})
    built, module = module_of([looping, fine])
    bad = by_name(built, module, "looping")
    assert bad.unwind_size is None
    assert "loops" in bad.problem and "0x" in bad.problem
    assert by_name(built, module, "fine").unwind_size == 0x28
    assert any(problem.kind == "bad_unwind_info" and "loops" in problem.message for problem in module.problems)


def test_unwind_info_outside_the_image_is_a_problem_naming_the_entry():
    built = build_pe("x64", [Function("f", [RET], {"slots": alloc_slots(0, 0x28)})])
    image = PEImage.from_bytes(built.data, "test.sys")
    begin, end, _ = runtime_functions(image)[0]
    frame = frame_from_unwind(image, (begin, end, 0x7FFFFFF0))
    assert frame.frame_size is None
    assert "outside the image" in frame.problem


def test_pdata_entry_outside_the_image_is_skipped_with_a_problem():
    body = [b"\x48\x83\xec\x28", b"\x48\x83\xc4\x28", RET]
    unwind = {"prolog_size": 4, "slots": alloc_slots(4, 0x28)}
    built = build_pe("x64", [Function("f", body, unwind), Function("g", body, unwind)])
    data = bytearray(built.data)
    pdata_rva = [s for s in PEImage.from_bytes(built.data).sections if s.name == ".pdata"][0].rva
    # Corrupt the second entry so that it points far beyond SizeOfImage.
    data[pdata_rva + 12:pdata_rva + 24] = struct.pack("<III", 0x7FFF0000, 0x7FFF0010, 0x7FFF0020)
    module = ModuleFunctions(PEImage.from_bytes(bytes(data), "test.sys"))
    assert any(problem.kind == "pdata_entry_outside_code" and "RUNTIME_FUNCTION #1" in problem.message
               for problem in module.problems)
    assert module.functions[built.image_base + built.rvas["f"]].unwind_size == 0x28


def test_unknown_operation_and_codes_running_past_the_array_are_problems():
    built, module = module_of([Function("odd", [RET], {"slots": [unwind_slot(0, 11, 0)]}),
                               Function("short", [RET], {"slots": [unwind_slot(0, 1, 1), 0x10]})])
    odd = by_name(built, module, "odd")
    short = by_name(built, module, "short")
    assert "unknown unwind operation 11" in odd.problem and odd.unwind_size is None
    assert "runs past the code array" in short.problem and short.unwind_size is None
