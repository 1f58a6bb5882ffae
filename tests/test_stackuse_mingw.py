"""The estimator against gcc's own numbers: frames.c built by MinGW-w64 for x64 and
x86 at -O0 and -O2 with -fstack-usage.

gcc's .su figure counts the return address (a leaf that touches nothing reports 8
on x64, 4 on x86), so our frame_size (bytes the function moves SP below its return
address) is the .su number minus the pointer size.  "dynamic" .su entries must come
out as dynamic with no frame size."""

import pytest

from stackuse_support import CONFIGS, build_all

STATIC = ["sink", "leaf_add", "small_locals", "medium_locals", "big_locals", "many_saves", "recursive_sum",
          "chain_c", "chain_b", "chain_a", "tail_target", "tail_caller", "indirect_caller", "eight_args",
          "calls_eight_args", "stdcall_callee", "calls_stdcall", "calls_import"]
DYNAMIC = ["alloca_user", "vla_user"]


@pytest.fixture(scope="module")
def builds():
    return build_all()


@pytest.fixture(params=CONFIGS, ids=["%s-%s" % config for config in CONFIGS])
def build(request, builds):
    return builds[request.param]


def test_static_frames_match_gcc_stack_usage(build):
    for name in STATIC:
        size, qualifier = build.stack_usage[name]
        assert qualifier == "static"
        function = build.function(name)
        assert function.frame_size == size - build.pointer_size, name
        assert not function.dynamic, name


def test_dynamic_frames_are_reported_dynamic_without_a_size(build):
    for name in DYNAMIC:
        assert build.stack_usage[name][1].startswith("dynamic")
        function = build.function(name)
        assert function.dynamic
        assert function.frame_size is None
        bound = build.bound(name)
        assert bound.status == "lower"
        assert any("dynamic frame" in reason for reason in bound.reasons)


@pytest.mark.parametrize("level", ["O0", "O2"])
def test_x64_unwind_data_and_prologue_agree_on_every_static_function(builds, level):
    build = builds[("x64", level)]
    for name in STATIC:
        function = build.function(name)
        assert function.source == "both", (name, function.disagreement)
        assert function.disagreement is None


def test_worst_case_chain_is_the_sum_of_gcc_frames_along_it(build):
    su = dict((name, size) for name, (size, _) in build.stack_usage.items())
    # chain_a -> chain_b -> chain_c -> sink; every .su number includes its own return
    # address and gcc calls at the full frame depth, so the sum is the bound.
    expected = su["chain_a"] + su["chain_b"] + su["chain_c"] + su["sink"]
    bound = build.bound("chain_a")
    assert (bound.value, bound.status) == (expected, "exact")
    steps = build.graph.chain(build.function("chain_a"))
    assert [step[0].name for step in steps] == ["chain_a", "chain_b", "chain_c", "sink"]


def test_tail_call_reuses_the_callers_return_address(build):
    target = build.bound("tail_target").value
    caller = build.bound("tail_caller")
    if build.level == "O2":
        assert any(site.kind == "tail" for site in build.function("tail_caller").call_sites)
        assert caller.value == target  # `jmp`: no extra return address, no frame
    else:
        assert caller.value == build.stack_usage["tail_caller"][0] + target


def test_recursion_is_unbounded_and_names_the_cycle(build):
    bound = build.bound("recursive_sum")
    assert bound.status == "unbounded" and bound.depth is None
    assert "recursion: recursive_sum -> recursive_sum" in bound.reasons


def test_indirect_call_makes_a_lower_bound(build):
    bound = build.bound("indirect_caller")
    assert bound.status == "lower"
    assert bound.value == build.stack_usage["indirect_caller"][0] + build.pointer_size
    assert any(reason.startswith("indirect call at 0x") for reason in bound.reasons)


def test_import_call_is_named_and_makes_a_lower_bound(build):
    bound = build.bound("calls_import")
    assert bound.status == "lower"
    assert any("GetCurrentProcessId" in reason for reason in bound.reasons)


def test_stdcall_callee_popping_its_arguments_keeps_sp_tracking_right(build):
    # calls_stdcall makes one call; after it gcc re-adjusts ESP for the popped
    # arguments.  The depth must still be caller frame + callee depth.
    su = dict((name, size) for name, (size, _) in build.stack_usage.items())
    callee = build.bound("stdcall_callee").value
    assert build.bound("calls_stdcall").value == su["calls_stdcall"] + callee
    if build.arch == "x86":
        assert build.function("stdcall_callee").ret_pop == 12


def test_x86_arguments_on_the_stack_count_at_the_call_site(build):
    su = dict((name, size) for name, (size, _) in build.stack_usage.items())
    bound = build.bound("calls_eight_args")
    assert bound.value == su["calls_eight_args"] + su["eight_args"]
