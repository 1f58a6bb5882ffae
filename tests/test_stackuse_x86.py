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
