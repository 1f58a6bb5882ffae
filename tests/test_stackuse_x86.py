"""x86 frames against the compilers' own numbers: one generated C corpus
(tests/stackuse_corpus.py) built by MinGW-w64 i686 gcc and by clang for
i686-pc-windows-msvc with lld-link, at -O0, -O1, -O2 and -Os, checked against
``-fstack-usage``.  The MinGW DLLs keep a COFF symbol table; the clang DLLs give the
analysis nothing but code, exports and relocations.

The goal: at least 99 % of the functions agree with the compiler on every build,
and no function gets a wrong number — what cannot be exact is reported as dynamic
or unknown.  ``scripts/stackuse_exact.py`` prints the same comparison as a table."""

import os

import pytest

from dbgext.stackuse import analyze
from stackuse_corpus import BUILDS, COMPILER_LOW, EXACT, MISSED, WRONG, build_for_test, compare, generate

CORPUS = generate()


@pytest.fixture(scope="module", params=BUILDS, ids=["%s-%s" % config for config in BUILDS])
def built(request):
    result = build_for_test(*request.param, source=CORPUS)
    return result, analyze(pe=result.path)


def test_at_least_99_percent_of_frames_agree_with_the_compiler(built):
    result, analysed = built
    verdicts = compare(result, analysed)
    agreeing = [name for name, (verdict, _, _) in verdicts.items() if verdict in (EXACT, COMPILER_LOW)]
    assert len(verdicts) >= 300
    assert len(agreeing) >= 0.99 * len(verdicts), sorted(set(verdicts) - set(agreeing))


def test_no_function_gets_a_wrong_number_and_none_is_missed(built):
    result, analysed = built
    verdicts = compare(result, analysed)
    assert [(name, ours, wanted) for name, (verdict, ours, wanted) in verdicts.items() if verdict == WRONG] == []
    assert [name for name, (verdict, _, _) in verdicts.items() if verdict == MISSED] == []


def test_clangs_shortfall_is_only_ever_4_bytes_on_frames_that_realign_the_stack(built):
    result, analysed = built
    by_rva = {function.rva: function for function in analysed.functions}
    for name, (verdict, ours, wanted) in compare(result, analysed).items():
        if verdict == COMPILER_LOW:
            function = by_rva[result.locations[name]]
            assert result.toolchain.startswith("clang") and function.padding > 0 and ours == wanted + 4


def test_alloca_and_vla_frames_are_dynamic_without_a_size(built):
    result, analysed = built
    by_rva = {function.rva: function for function in analysed.functions}
    dynamic = [name for name, (_, is_dynamic) in result.expected.items() if is_dynamic and name in result.locations]
    assert dynamic
    for name in dynamic:
        function = by_rva[result.locations[name]]
        assert function.dynamic and function.frame_size is None, name


def test_each_function_says_which_source_found_it(built):
    result, analysed = built
    origins = {function.origin for function in analysed.functions}
    if result.toolchain.startswith("mingw"):
        assert "coff" in origins
    else:
        # No symbols: exports, calls, relocated pointers (the callback table) and
        # code nothing references.
        assert {"export", "call", "relocation", "gap"} <= origins
        # The callbacks are reached through their table (the optimiser calls some
        # of them directly too).
        wanted = {result.locations["callback_%d" % index] for index in range(8)}
        callbacks = [function for function in analysed.functions if function.rva in wanted]
        assert len(callbacks) == 8 and "relocation" in {function.origin for function in callbacks}


def test_argument_pushes_are_counted_at_each_call_site_not_in_the_frame(built):
    result, analysed = built
    # Somewhere in the corpus a call is made with arguments pushed right before it:
    # its depth exceeds the caller's frame by exactly those pushes.
    deeper = [site.depth - function.frame_size for function in analysed.functions if function.frame_size is not None
              and not function.dynamic for site in function.call_sites
              if site.kind == "call" and site.depth > function.frame_size]
    if result.toolchain == "clang-x86" and result.level != "O0":
        assert deeper and all(extra % 4 == 0 for extra in deeper)


# Only the clang builds have a PDB.
CLANG_BUILDS = [config for config in BUILDS if config[0].startswith("clang")]


@pytest.mark.parametrize("toolchain, level", CLANG_BUILDS, ids=["%s-%s" % config for config in CLANG_BUILDS])
def test_a_pdb_names_every_function_and_a_foreign_one_is_refused(toolchain, level):
    from dbgext.errors import BadInput
    result = build_for_test(toolchain, level, source=CORPUS)
    pdb = os.path.join(os.path.dirname(result.path), "corpus.pdb")
    named = analyze(pe=result.path, pdb=pdb)
    by_rva = {function.rva: function for function in named.functions}
    for name, rva in result.locations.items():
        assert by_rva[rva].name is not None
    assert "symbol" in {function.origin for function in named.functions}
    other = build_for_test(result.toolchain, "O2" if result.level != "O2" else "O1", CORPUS)
    with pytest.raises(BadInput, match="does not belong to"):
        analyze(pe=result.path, pdb=os.path.join(os.path.dirname(other.path), "corpus.pdb"))


# -- MSVC shapes, hand-assembled ---------------------------------------------------------------

from dbgext.stackuse.fixtures import Function, build_pe  # noqa: E402
from stackuse_support import analyse_built  # noqa: E402

RET = b"\xc3"
LEAF = Function("leaf", [RET], export=False)
FRAME_POINTER = [b"\x55", b"\x8b\xec"]                 # push ebp; mov ebp, esp
EPILOGUE = [b"\x8b\xe5", b"\x5d", RET]                 # mov esp, ebp; pop ebp; ret


def x86_functions(functions, symbols=()):
    built = build_pe("x86", functions)
    names = dict((built.rvas[name], name) for name in symbols) or None
    module = analyse_built(built, "x86", names)[1]
    base = module.image.image_base
    return dict((function.name, module.functions[base + built.rvas[function.name]]) for function in functions)


def test_a_finally_block_resuming_its_parents_frame_is_no_stack_allocator():
    # The parent calls its `__finally` block; the block leaves through the parent's
    # frame (`mov esp, [ebp - 0x18]`): ESP from another frame ends its path, so
    # neither it nor its caller is dynamic.
    parent = FRAME_POINTER + [b"\x83\xec\x10", b"\x89\x65\xe8", ("call", "block"), b"\x33\xc0"] + EPILOGUE
    block = [("call", "leaf"), b"\x8b\x65\xe8", b"\x5d", RET]
    found = x86_functions([Function("parent", parent), Function("block", block, export=False), LEAF])
    assert [(found[name].frame_size, found[name].dynamic, found[name].moves_sp) for name in ("parent", "block")] \
        == [(20, None, False), (0, None, False)]


def test_a_register_saved_past_a_call_counts_in_the_frame_and_an_argument_does_not():
    # sub esp, 8; call leaf; push esi (argument); call leaf; add esp, 4; push esi
    # (saved: written before it is read, popped back at the same depth); mov esi,
    # [ebp + 8]; call leaf; pop esi
    body = FRAME_POINTER + [b"\x83\xec\x08", ("call", "leaf"), b"\x56", ("call", "leaf"), b"\x83\xc4\x04",
                            b"\x56", b"\x8b\x75\x08", ("call", "leaf"), b"\x5e"] + EPILOGUE
    found = x86_functions([Function("late_save", body), LEAF])
    assert found["late_save"].frame_size == 4 + 8 + 4


def test_a_constant_alloca_after_the_frame_is_not_the_frame_but_deepens_the_calls_past_it():
    # sub esp, 0x10; push ebx; mov eax, 0x100; call __alloca_probe; call leaf
    body = FRAME_POINTER + [b"\x83\xec\x10", b"\x53", b"\xb8\x00\x01\x00\x00", ("call", "__alloca_probe"),
                            ("call", "leaf"), b"\x5b"] + EPILOGUE
    found = x86_functions([Function("alloca", body), Function("__alloca_probe", [RET], export=False), LEAF],
                          symbols=["__alloca_probe"])
    function = found["alloca"]
    assert function.frame_size == 4 + 0x10 + 4
    assert [site.depth for site in function.call_sites if site.target == found["leaf"].va] == [24 + 0x100]


def test_an_add_esp_with_a_negative_32_bit_immediate_allocates():
    # add esp, 0xfffffecc (MSVC 7.1's `add esp, -0x134`); push ebx; call leaf
    body = FRAME_POINTER + [b"\x81\xc4\xcc\xfe\xff\xff", b"\x53", ("call", "leaf"), b"\x5b"] + EPILOGUE
    assert x86_functions([Function("negative", body), LEAF])["negative"].frame_size == 4 + 0x134 + 4
