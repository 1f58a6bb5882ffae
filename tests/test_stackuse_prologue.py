"""Prologue analysis on hand-assembled code: the x64 and x86 shapes real compilers
emit, stack probes, the SEH helper, shrink-wrapping, dynamic frames, and SP
tracking at call sites."""

from dbgext.stackuse.fixtures import Function, alloc_slots, build_pe, push_slot
from dbgext.stackuse.prologue import Decoder, common_x64_frame, scan_prologue
from stackuse_support import analyse_built, function_named

RET = b"\xc3"
LEAF = Function("leaf", [RET], export=False)


def analyse(arch, functions, symbols=None):
    built = build_pe(arch, functions)
    names = None
    if symbols:
        names = {built.rvas[name]: name for name in symbols}
    return built, analyse_built(built, arch, names)[1:]


def frame(arch, functions, name, symbols=None):
    built, (module, graph) = analyse(arch, functions, symbols)
    return function_named(module, name)


# -- x64 ---------------------------------------------------------------------------------------


def test_x64_home_space_saves_do_not_count_but_push_and_sub_do():
    body = [b"\x48\x89\x5c\x24\x08", b"\x48\x89\x74\x24\x10", b"\x57", b"\x48\x83\xec\x30", ("call", "leaf"),
            b"\x48\x83\xc4\x30", b"\x5f", RET]
    function = frame("x64", [Function("saves", body), LEAF], "saves")
    assert (function.frame_size, function.source) == (0x38, "prologue")


def test_x64_chkstk_frame_is_the_probe_size_followed_by_sub_rsp_rax():
    body = [b"\x53", b"\xb8\x10\x20\x00\x00", ("call", "probe"), b"\x48\x29\xc4", ("call", "leaf"),
            b"\x48\x81\xc4\x10\x20\x00\x00", b"\x5b", RET]
    function = frame("x64", [Function("big", body), Function("probe", [RET], export=False), LEAF], "big")
    assert function.frame_size == 8 + 0x2010 and not function.dynamic


def test_x64_shrink_wrapped_prologue_behind_an_early_exit_is_found():
    body = [b"\x48\x85\xc9", b"\x75\x03", b"\x31\xc0", RET,
            b"\x53", b"\x48\x83\xec\x20", ("call", "leaf"), b"\x48\x83\xc4\x20", b"\x5b", RET]
    assert frame("x64", [Function("wrapped", body), LEAF], "wrapped").frame_size == 0x28


def test_x64_frame_pointer_set_between_pushes_and_sub_is_skipped():
    body = [b"\x55", b"\x53", b"\x48\x83\xec\x28", b"\x48\x8d\x6c\x24\x20", ("call", "leaf"),
            b"\x48\x83\xc4\x28", b"\x5b", b"\x5d", RET]
    assert frame("x64", [Function("fp", body), LEAF], "fp").frame_size == 0x38


def test_x64_epilogue_restoring_rsp_from_a_copy_is_not_dynamic():
    body = [b"\x49\x89\xe3", b"\x53", b"\x48\x83\xec\x40", ("call", "leaf"), b"\x4c\x8d\x5c\x24\x40",
            b"\x4c\x89\xdc", b"\x5b", RET]
    built, (module, graph) = analyse("x64", [Function("copy", body), LEAF])
    function = function_named(module, "copy")
    assert (function.frame_size, function.dynamic, function.sp_lost) == (0x48, None, None)
    assert graph.bound(function).value == 8 + 0x48 + 8


def test_x64_sub_rsp_register_is_a_dynamic_frame_without_a_size():
    body = [b"\x55", b"\x48\x89\xe5", b"\x48\x29\xcc", ("call", "leaf"), b"\x48\x89\xec", b"\x5d", RET]
    function = frame("x64", [Function("alloca", body), LEAF], "alloca")
    assert function.dynamic == "sub rsp, rcx"
    assert function.frame_size is None


def test_x64_unwind_and_prologue_disagreeing_reports_both_and_trusts_unwind():
    body = [b"\x48\x83\xec\x28", ("call", "leaf"), b"\x48\x83\xc4\x28", RET]
    function = frame("x64", [Function("liar", body, {"prolog_size": 4, "slots": alloc_slots(4, 0x48)}), LEAF],
                     "liar")
    assert (function.frame_size, function.source) == (0x48, "unwind")
    assert function.disagreement == "prologue scan found 40 bytes, unwind data says 72"


def test_x64_leaf_without_pdata_is_discovered_through_the_call():
    body = [b"\x48\x83\xec\x28", ("call", "leaf"), b"\x48\x83\xc4\x28", RET]
    built, (module, graph) = analyse("x64", [Function("caller", body, {"prolog_size": 4,
                                                                       "slots": alloc_slots(4, 0x28)}), LEAF])
    leaf = module.functions[built.image_base + built.rvas["leaf"]]
    assert (leaf.origin, leaf.frame_size) == ("call", 0)
    assert graph.bound(function_named(module, "caller")).value == 8 + 0x28 + 8


# -- x86 ---------------------------------------------------------------------------------------


def test_x86_hotpatch_pad_frame_pointer_sub_and_register_saves():
    body = [b"\x8b\xff", b"\x55", b"\x8b\xec", b"\x81\xec\x8c\x00\x00\x00", b"\x53", b"\x56", b"\x57",
            b"\x50", ("call", "leaf"), b"\x83\xc4\x04", b"\x5f", b"\x5e", b"\x5b", b"\xc9", RET]
    built, (module, graph) = analyse("x86", [Function("classic", body), LEAF])
    function = function_named(module, "classic")
    assert function.frame_size == 4 + 0x8c + 12        # the argument push is not frame
    assert [site.depth for site in function.call_sites] == [4 + 0x8c + 12 + 4]
    assert graph.bound(function).value == 4 + (4 + 0x8c + 12 + 4) + 4


def test_x86_chkstk_moves_esp_itself():
    body = [b"\x55", b"\x8b\xec", b"\xb8\x00\x30\x00\x00", ("call", "__chkstk"), ("call", "leaf"), b"\xc9", RET]
    function = frame("x86", [Function("big", body), Function("__chkstk", [RET], export=False), LEAF], "big",
                     symbols=["__chkstk"])
    assert function.frame_size == 4 + 0x3000


def test_x86_seh_prolog4_frame_is_locals_plus_the_helpers_record():
    body = [b"\x6a\x10", b"\x68", ("abs", "leaf"), ("call", "__SEH_prolog4"), ("call", "leaf"),
            ("call", "__SEH_epilog4"), RET]
    helpers = [Function("__SEH_prolog4", [RET], export=False), Function("__SEH_epilog4", [RET], export=False)]
    built, (module, graph) = analyse("x86", [Function("guarded", body)] + helpers + [LEAF],
                                     symbols=["__SEH_prolog4", "__SEH_epilog4"])
    function = function_named(module, "guarded")
    assert function.frame_size == 0x10 + 36
    leaf_va = built.image_base + built.rvas["leaf"]
    assert [site.depth for site in function.call_sites if site.target == leaf_va] == [0x10 + 36]
    assert function.sp_lost is None


def test_x86_callee_popping_its_arguments_keeps_later_call_sites_right():
    caller = [b"\x55", b"\x8b\xec", b"\x6a\x01", b"\x6a\x02", b"\x6a\x03", ("call", "std3"),
              b"\x6a\x07", ("call", "leaf"), b"\x83\xc4\x04", b"\x5d", RET]
    std3 = [b"\xc2\x0c\x00"]
    built, (module, graph) = analyse("x86", [Function("caller", caller), Function("std3", std3), LEAF])
    function = function_named(module, "caller")
    assert function_named(module, "std3").ret_pop == 12
    assert [site.depth for site in function.call_sites] == [4 + 12, 4 + 4]


def test_x86_functions_without_exports_are_found_by_following_calls():
    middle = Function("middle", [b"\x56", ("call", "leaf"), b"\x5e", RET], export=False)
    root = Function("root", [b"\x83\xec\x10", ("call", "middle"), b"\x83\xc4\x10", RET])
    built, (module, graph) = analyse("x86", [root, middle, LEAF])
    found = module.functions[built.image_base + built.rvas["middle"]]
    assert (found.origin, found.frame_size) == ("call", 4)
    assert graph.bound(function_named(module, "root")).value == 4 + 0x10 + 4 + 4 + 4


def test_push_slot_and_alloc_slots_encode_what_the_unwinder_reads():
    assert push_slot(1, 3) == [0x3001]
    assert alloc_slots(4, 0x28) == [0x4204]


def test_x86_dispatch_routine_stored_by_address_is_discovered():
    # mov dword ptr [eax + 0x38], offset Dispatch  (DriverObject->MajorFunction[0])
    entry = Function("DriverEntry", [b"\x8b\x44\x24\x04", b"\xc7\x40\x38", ("abs", "Dispatch"), b"\x31\xc0",
                                     b"\xc2\x08\x00"])
    dispatch = Function("Dispatch", [b"\x55", b"\x8b\xec", b"\x83\xec\x40", b"\xc9", b"\xc2\x08\x00"],
                        export=False)
    built, (module, graph) = analyse("x86", [entry, dispatch])
    found = module.functions[built.image_base + built.rvas["Dispatch"]]
    assert (found.origin, found.frame_size, found.ret_pop) == ("address-taken", 4 + 0x40, 8)


# -- x86: what real compilers emit (MSVC, clang-msvc), without symbols ------------------------

PUSH_EBP, MOV_EBP_ESP, POP_EBP, LEAVE = b"\x55", b"\x8b\xec", b"\x5d", b"\xc9"
PUSH_ECX = b"\x51"
CALL_CLEANUP_4 = b"\x83\xc4\x04"  # add esp, 4
# An MSVC-style __chkstk: moves ESP down by EAX itself (no symbol names it).
CHKSTK_BODY = [b"\x51", b"\x8d\x4c\x24\x08", b"\x29\xc1", b"\x89\xe0", b"\x89\xcc", b"\x8b\x08", b"\xff\x70\x04", RET]
# MSVC's __EH_prolog3 as its first instructions give it away.
EH_PROLOG3_BODY = [b"\x50", b"\x64\xff\x35\x00\x00\x00\x00", b"\x8d\x44\x24\x0c", b"\x2b\x64\x24\x0c", b"\x53",
                   b"\x56", b"\x57", b"\x89\x28", b"\x89\xc5", b"\x50", b"\xff\x75\xfc",
                   b"\xc7\x45\xfc\xff\xff\xff\xff", b"\x8d\x45\xf4", b"\x64\xa3\x00\x00\x00\x00", RET]


def test_x86_push_ecx_after_the_frame_pointer_is_msvcs_4_byte_local():
    # push ebp; mov ebp, esp; push ecx; mov eax, [ebp+8]; mov [ebp-4], eax; push eax; call; add esp, 4
    body = [PUSH_EBP, MOV_EBP_ESP, PUSH_ECX, b"\x8b\x45\x08", b"\x89\x45\xfc", b"\x50", ("call", "leaf"),
            CALL_CLEANUP_4, LEAVE, RET]
    built, (module, graph) = analyse("x86", [Function("local", body), LEAF])
    function = function_named(module, "local")
    assert function.frame_size == 8
    assert [site.depth for site in function.call_sites] == [8 + 4]  # the argument push counts at the call


def test_x86_push_ecx_the_next_call_takes_is_an_argument_not_a_local():
    # fastcall passing its first argument on: push ebp; mov ebp, esp; push ecx; call; add esp, 4
    body = [PUSH_EBP, MOV_EBP_ESP, PUSH_ECX, ("call", "leaf"), CALL_CLEANUP_4, POP_EBP, RET]
    built, (module, graph) = analyse("x86", [Function("forward", body), LEAF])
    function = function_named(module, "forward")
    assert function.frame_size == 4
    assert [site.depth for site in function.call_sites] == [8]


def test_x86_realigned_frame_leaves_the_padding_out_but_depths_count_it():
    # push ebp; mov ebp, esp; and esp, -16; sub esp, 0x20; call; mov esp, ebp; pop ebp
    body = [PUSH_EBP, MOV_EBP_ESP, b"\x83\xe4\xf0", b"\x83\xec\x20", ("call", "leaf"), b"\x89\xec", POP_EBP, RET]
    built, (module, graph) = analyse("x86", [Function("aligned", body), LEAF])
    function = function_named(module, "aligned")
    assert (function.frame_size, function.padding, function.dynamic) == (4 + 0x20, 12, None)
    assert [site.depth for site in function.call_sites] == [4 + 0x20 + 12]


def test_x86_stack_pointer_saved_in_a_slot_and_restored_is_not_dynamic():
    # clang's stacksave around a call: push esi; sub esp, 8; mov [esp+4], esp; sub esp, 16;
    # call; mov esp, [esp+20]; add esp, 8; pop esi
    body = [b"\x56", b"\x83\xec\x08", b"\x89\x64\x24\x04", b"\x83\xec\x10", ("call", "leaf"), b"\x8b\x64\x24\x14",
            b"\x83\xc4\x08", b"\x5e", RET]
    built, (module, graph) = analyse("x86", [Function("saved", body), LEAF])
    function = function_named(module, "saved")
    assert (function.frame_size, function.dynamic, function.sp_lost) == (12, None, None)
    assert graph.bound(function).status == "exact"


def test_x86_unnamed_stack_allocator_is_known_by_what_its_code_does():
    constant = [PUSH_EBP, MOV_EBP_ESP, b"\xb8\x00\x20\x00\x00", ("call", "allocator"), ("call", "leaf"), LEAVE, RET]
    variable = [PUSH_EBP, MOV_EBP_ESP, b"\x89\xd8", ("call", "allocator"), ("call", "leaf"), LEAVE, RET]
    allocator = Function("allocator", CHKSTK_BODY, export=False)
    built, (module, graph) = analyse("x86", [Function("big", constant), Function("alloca", variable), allocator,
                                             LEAF])
    assert module.functions[built.image_base + built.rvas["allocator"]].moves_sp
    assert function_named(module, "big").frame_size == 4 + 0x2000
    dynamic = function_named(module, "alloca")
    assert dynamic.dynamic.startswith("call at 0x") and dynamic.frame_size is None
    assert graph.bound(dynamic).status == "lower"


def test_x86_eh_prolog3_without_a_name_builds_its_callers_frame():
    # push 0x10; mov eax, handler; call __EH_prolog3 (unnamed)
    body = [b"\x6a\x10", b"\xb8", ("abs", "leaf"), ("call", "helper"), ("call", "leaf"), RET]
    built, (module, graph) = analyse("x86", [Function("guarded", body), Function("helper", EH_PROLOG3_BODY,
                                                                                 export=False), LEAF])
    function = function_named(module, "guarded")
    assert function.frame_size == 0x10 + 32
    leaf = built.image_base + built.rvas["leaf"]
    assert [site.depth for site in function.call_sites if site.target == leaf] == [0x10 + 32]


def test_x86_code_nothing_references_is_found_after_the_previous_body():
    unreferenced = Function("unreferenced", [b"\x56", b"\x83\xec\x10", b"\x83\xc4\x10", b"\x5e", RET],
                            export=False)
    built, (module, graph) = analyse("x86", [Function("first", [RET]), unreferenced])
    found = module.functions[built.image_base + built.rvas["unreferenced"]]
    assert (found.origin, found.frame_size) == ("gap", 4 + 0x10)


class _CodeImage(object):
    """Just ``code`` at the image base: what the prologue scan reads."""

    arch = "x64"
    image_base = 0x180000000
    name = "code"

    def __init__(self, code):
        self.code = code

    def read_partial(self, rva, size):
        return self.code[rva:rva + size] if rva >= 0 else b""


def _scan(code, common_shapes=True):
    image = _CodeImage(code)
    decoder = Decoder(image)
    if not common_shapes:
        decoder.common_frame = lambda va: None
    result = scan_prologue(decoder, image.image_base)
    return result.frame_size, result.dynamic, result.problem, result.padding


def test_x64_common_prologues_read_from_their_bytes_give_what_decoding_them_gives():
    pushes = b"\x56\x53\x41\x54\x41\x57"  # push rsi; push rbx; push r12; push r15
    common = [
        pushes + b"\x48\x83\xec\x28\xc3",
        b"\x48\x81\xec\x00\x01\x00\x00\xc3",
        pushes + b"\xb8\x58\x23\x00\x00\xe8\x00\x00\x00\x00\x48\x29\xc4\xc3",
        b"\xb8\x00\x10\x00\x00" + pushes + b"\x48\x83\xec\x20\xc3",
    ]
    for code in common:
        assert common_x64_frame(code) is not None
        assert _scan(code) == _scan(code, common_shapes=False)
    assert common_x64_frame(common[0]) == 4 * 8 + 0x28
    assert common_x64_frame(common[2]) == 4 * 8 + 0x2358


def test_x64_other_prologues_are_left_to_the_scan():
    others = [
        b"\x57\x56\x53\x48\x83\xc4\x80\xc3",          # add rsp, -0x80 does not end the prologue
        b"\x48\x83\xec\xf8\xc3",                      # a negative imm8
        b"\x48\x81\xec\x00\x00\x00\x80\xc3",          # an imm32 with its sign bit set
        b"\xb8\x00\x10\x00\x00\xe8\x00\x00\x00\x00\xc3",  # a call not followed by sub rsp, rax
        b"\xe8\x00\x00\x00\x00\x48\x29\xc4",          # no size in eax before the call
        b"\x40\x53\x48\x83\xec\x20\xc3",              # a REX-prefixed push
        b"\x53\x53",                                   # cut short
        b"",
    ]
    for code in others:
        assert common_x64_frame(code) is None
        assert _scan(code) == _scan(code, common_shapes=False)
