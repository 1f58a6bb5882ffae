"""The instruction flow against libipt's instruction decoder, class by class.

Each class is a kind of trace the tracer (tests/ipt_tracer.py) writes over random
code: both decoders must produce the same instructions (and agree on whether there
was an error).  The erratum classes write an erratum's signature and run with the
CPU that has it (libipt applies its workaround) and without a CPU (it does not);
the other classes of COMPARED hold traces libipt fails on.  Run as a script to print
how many cases of each class match:

    python tests/test_ipt_differential.py [CASES_PER_CLASS]
"""

import sys

import pytest

import ipt_support as libipt
import ipt_tracer as T
from dbgext.ipt.flow import CodeImage, decode_flow
from dbgext.ipt.packets import PSB

pytestmark = pytest.mark.skipif(libipt.LIB is None, reason=libipt.SKIP_REASON)

BASE = 0x401000
CASES = 12

# class -> (tracer options, --cpu for both decoders or None)
CLASSES = {
    "straight": ({}, None),
    "end_of_trace": ({"interrupt_every": 40, "timing": True}, None),
    "disable_after_direct_branch": ({"disable_every": 15}, None),
    "trace_ends_disabled_after_direct_branch": ({"disable_every": 6, "end_disabled": True}, None),
    "overflow": ({"overflow_every": 150}, None),
    "overflow_resumed_by_tip_pge": ({"overflow_every": 150, "overflow_resume": "pge"}, None),
    "deferred_tip": ({"deferred_tip_every": 2, "uncompressed_ret_every": 2}, None),
    "tsx": ({"tsx_every": 60, "psb_every": 128}, None),
    "far_transfer_traced": ({"kernel_traced": True}, None),
    "far_transfer_untraced": ({"kernel_traced": False}, None),
    "interrupts_and_psbs": ({"interrupt_every": 25, "psb_every": 64, "use_tnt64": True}, None),
    "erratum_apl11": ({"overflow_every": 150, "overflow_resume": "pgd+pge"}, (6, 0x5C, 9)),
}

BROADWELL, SKYLAKE, SKYLAKE_SERVER, APOLLO_LAKE = (6, 0x3D, 4), (6, 0x4E, 3), (6, 0x55, 4), (6, 0x5C, 9)

# class -> (tracer options, the --cpu values both decoders run with); errors allowed when
# both decoders fail alike.  Erratum classes run with the CPU that has the erratum and
# without one.
COMPARED = {
    "erratum_bdm70": ({"disable_every": 6, "psb_while_disabled": True}, (BROADWELL, None)),
    "erratum_bdm64": ({"tsx_every": 6, "tsx_abort_corrupts_branch": True}, (BROADWELL, None)),
    "erratum_skd007": ({"overflow_every": 100, "cyc_cut_by_overflow": True, "timing": True}, (SKYLAKE, None)),
    "erratum_skd010": ({"overflow_every": 100, "overflow_resume": "psb"}, (SKYLAKE, None)),
    "erratum_skl014": ({"disable_every": 15, "disable_ip_suppressed": True}, (SKYLAKE, None)),
    "erratum_apl11": ({"overflow_every": 150, "overflow_resume": "pgd+pge"}, (APOLLO_LAKE, None)),
    "erratum_apl12": ({"overflow_every": 100, "overflow_resume": "fup+pge"}, (APOLLO_LAKE, None)),
    "erratum_skz84": ({"corrupted_tma": True, "psb_every": 256}, (SKYLAKE_SERVER, None)),
    "tip_pgd_without_ip_at_indirect_call": ({"pgd_without_ip_every": 3, "psb_every": 256}, (None, SKYLAKE)),
    "fup_in_psb_while_disabled": ({"disable_every": 6, "psb_while_disabled": True, "psb_every": 512},
                                  (None, SKYLAKE)),
}


def case(name, seed):
    """(program, trace, cpu) of one case of a CLASSES class."""
    return compared_case(name, seed) + (CLASSES[name][1],)


def compared_case(name, seed):
    """(program, trace) of one case of a CLASSES or COMPARED class."""
    options = (CLASSES.get(name) or COMPARED[name])[0]
    program = T.random_program(BASE, functions=30, seed=seed, syscalls=True)
    trace, _ = T.trace_program(program, 50 + seed * 37 % 600, seed=seed, **options)
    return program, trace


def ours(program, trace, cpu=None, regions=None):
    from dbgext.ipt.errata import cpu_errata
    regions = regions or {program.base: program.code}
    return decode_flow(trace, CodeImage(images=sorted(regions.items())), errata=cpu_errata(cpu))


def both(name, seed, cpu=()):
    """(libipt's instructions, errors, events; our FlowResult) for one case; ``cpu``: the
    class's own unless given."""
    program, trace = compared_case(name, seed)
    cpu = CLASSES[name][1] if cpu == () else cpu
    events = []
    segments = libipt.instruction_segments(trace, {program.base: program.code}, cpu, events=events)
    ips = [ip for segment, _ in segments for ip in segment]
    errors = [error for _, error in segments if error is not None]
    return ips, errors, events, ours(program, trace, cpu)


# our event kind -> libipt's, for the events both decoders report
EVENT_KINDS = {"enabled": "enabled", "disabled": "disabled", "interrupt": "async_branch", "overflow": "overflow"}


def comparable_events(theirs, result):
    """Both event lists as (instruction index, libipt kind, IP); overflows without the
    IP (libipt gives where tracing resumed, which we report as ``resumed``)."""
    wanted = set(EVENT_KINDS.values())
    return ([(index, kind, None if kind == "overflow" else ip) for index, kind, ip in theirs if kind in wanted],
            [(index, EVENT_KINDS[kind], ip) for index, kind, offset, ip in result.events if kind in EVENT_KINDS])


def matches(name, seed, cpu=()):
    ips, errors, events, result = both(name, seed, cpu)
    theirs, mine = comparable_events(events, result)
    return result.instructions == ips and bool(result.problems.errors) == bool(errors) and theirs == mine


@pytest.mark.parametrize("seed", range(CASES))
@pytest.mark.parametrize("name", sorted(CLASSES))
def test_flow_matches_libipt(name, seed):
    ips, errors, _, result = both(name, seed)
    assert errors == [] and result.problems == []
    assert result.instructions == ips


@pytest.mark.parametrize("seed", range(CASES))
@pytest.mark.parametrize("name", sorted(CLASSES))
def test_events_come_where_libipt_reports_them(name, seed):
    """Same instruction index and IP for enabled, disabled ("disabled at <target>" of
    the branch that left the traced range) and asynchronous transfers; same index
    for overflows."""
    _, _, events, result = both(name, seed)
    theirs, mine = comparable_events(events, result)
    assert theirs == mine


COMPARED_RUNS = [(name, cpu) for name, (_, cpus) in sorted(COMPARED.items()) for cpu in cpus]


@pytest.mark.parametrize("seed", range(CASES))
@pytest.mark.parametrize("name,cpu", COMPARED_RUNS)
def test_errata_and_failures_match_libipt(name, cpu, seed):
    """Same instructions, events and failing or not, with and without the erratum's CPU."""
    ips, errors, events, result = both(name, seed, cpu)
    theirs, mine = comparable_events(events, result)
    assert result.instructions == ips
    assert bool(result.problems.errors) == bool(errors)
    assert theirs == mine


@pytest.mark.parametrize("seed", range(CASES))
@pytest.mark.parametrize("name", sorted(CLASSES))
def test_clean_traces_decode_alike_with_every_erratum_workaround(name, seed):
    """A Skylake part has the most errata (BDM70, SKD007, SKD010, SKD022, SKL014,
    SKL168); traces without their signatures decode as without a CPU."""
    ips, errors, _, result = both(name, seed, SKYLAKE if CLASSES[name][1] is None else CLASSES[name][1])
    assert errors == [] and result.problems == []
    assert result.instructions == ips


@pytest.mark.parametrize("seed", [210, 404])
def test_after_a_tip_pge_while_tracing_is_on_the_resync_skips_the_psb_right_after_it(seed):
    """libipt reads on through a PSB+ that directly follows a TIP.PGE before it finds
    the TIP.PGE wrong (tracing is on): its resync goes to the PSB after that one."""
    program, trace = compared_case("fup_in_psb_while_disabled", seed)
    ips, errors, events, result = both("fup_in_psb_while_disabled", seed, None)
    assert errors and [offset for offset, _ in errors][-1] > trace.rfind(PSB)  # libipt read past the last PSB
    assert result.instructions == ips
    theirs, mine = comparable_events(events, result)
    assert theirs == mine


def gap_case(seed):
    """Code with a hole (one function missing from the image): libipt stops at the
    hole and resyncs at the next PSB; dbgext reports a gap and resumes earlier."""
    program = T.random_program(BASE, functions=30, seed=seed, syscalls=True)
    trace, expected = T.trace_program(program, 1500, seed=seed, psb_every=256)
    hole_start = program.labels["f%d" % (3 + seed % 5)]
    hole_end = program.labels["f%d" % (4 + seed % 5)]
    regions = {program.base: program.code[:hole_start - program.base],
               hole_end: program.code[hole_end - program.base:]}
    return program, trace, regions


def gap_matches(seed):
    program, trace, regions = gap_case(seed)
    segments = libipt.instruction_segments(trace, regions)
    result = ours(program, trace, regions=regions)
    before_hole, after_last_sync = segments[0][0], segments[-1][0]
    return (result.instructions[:len(before_hole)] == before_hole
            and result.instructions[len(result.instructions) - len(after_last_sync):] == after_last_sync
            and len(result.instructions) >= sum(len(ips) for ips, _ in segments))


@pytest.mark.parametrize("seed", range(CASES))
def test_unreadable_code_is_a_gap_and_decoding_resumes_before_libipt_would(seed):
    program, trace, regions = gap_case(seed)
    result = ours(program, trace, regions=regions)
    kinds = [event[1] for event in result.events]
    if "gap" in kinds:
        assert kinds[kinds.index("gap") + 1] in ("resync", "sync", "enabled")
    assert gap_matches(seed)


def test_the_erratum_workaround_needs_the_cpu():
    """Without --cpu, a TIP.PGD right after an OVF is an error in both decoders."""
    program, trace, cpu = case("erratum_apl11", 1)
    ips, errors = libipt.instruction_flow(trace, {program.base: program.code})
    result = ours(program, trace)
    assert errors and "--cpu" in result.problems[0].message
    assert result.instructions == ips


def _pairs(packets):
    return list(zip(packets, packets[1:]))


# class -> does this case's trace hold what the class is about?  (packets, program)
EXERCISED = {
    "disable_after_direct_branch": lambda packets, program: any(p.type == "tip.pgd" for p in packets),
    "trace_ends_disabled_after_direct_branch": lambda packets, program: packets[-1].type == "tip.pgd",
    "overflow": lambda packets, program: any(p.type == "ovf" for p in packets),
    "overflow_resumed_by_tip_pge": lambda packets, program: any(
        a.type == "ovf" and b.type == "tip.pge" for a, b in _pairs(packets)),
    "deferred_tip": lambda packets, program: any(
        a.type == "tnt8" and b.type == "tip" and b.fields["ip"] in program.by_address and
        program.by_address[b.fields["ip"]].address in program.labels.values() for a, b in _pairs(packets)),
    "tsx": lambda packets, program: any(p.type == "mode.tsx" and p.fields["abort"] for p in packets),
    "far_transfer_traced": lambda packets, program: any(
        p.type == "tip" and p.fields["ip"] == program.syscall_handler for p in packets),
    "far_transfer_untraced": lambda packets, program: any(
        p.type == "tip.pgd" and p.fields["ip"] is None for p in packets),
    "interrupts_and_psbs": lambda packets, program: sum(p.type == "psb" for p in packets) > 1,
    "erratum_apl11": lambda packets, program: any(a.type == "ovf" and b.type == "tip.pgd"
                                                  for a, b in _pairs(packets)),
    "erratum_bdm70": lambda packets, program: any(a.type == "psbend" and b.type == "tip.pge"
                                                  for a, b in _pairs(packets)),
    "erratum_bdm64": lambda packets, program: any(p.type == "mode.tsx" and p.fields["abort"] for p in packets),
    "erratum_skd007": lambda packets, program: any(
        a.type == "cyc" and a.fields["value"] >> 5 == 1 and b.type == "cyc" and b.fields["value"] == 30
        and b.offset == a.offset + 2 for a, b in _pairs(packets)),
    "erratum_skd010": lambda packets, program: any(a.type == "ovf" and b.type == "psb" for a, b in _pairs(packets)),
    "erratum_skl014": lambda packets, program: any(p.type == "tip.pgd" and p.fields["ip"] is None
                                                   for p in packets),
    "erratum_skz84": lambda packets, program: True,  # every PSB+ (decode_packets stops at the first)
    "erratum_apl12": lambda packets, program: any(a.type == "ovf" and b.type == "fup" and c.type == "tip.pge"
                                                  for a, b, c in zip(packets, packets[1:], packets[2:])),
    "tip_pgd_without_ip_at_indirect_call": lambda packets, program: any(
        p.type == "tip.pgd" and p.fields["ip"] is None for p in packets),
    "fup_in_psb_while_disabled": lambda packets, program: any(a.type == "psbend" and b.type == "tip.pge"
                                                              for a, b in _pairs(packets)),
}


def counts(cases):
    """(class, cases that match libipt, cases whose trace holds the class's feature, cases)."""
    from dbgext.ipt.packets import decode_packets
    rows = []
    runs = [(name, ()) for name in CLASSES] + COMPARED_RUNS
    for name, cpu in runs:
        good = exercised = 0
        for seed in range(cases):
            program, trace = compared_case(name, seed)
            good += matches(name, seed, cpu)
            exercised += EXERCISED.get(name, lambda packets, program: True)(decode_packets(trace).packets, program)
        label = name if cpu == () else "%s --cpu %s" % (name, "/".join(map(str, cpu)) if cpu else "none")
        rows.append((label, good, exercised, cases))
    gaps = sum(any(event[1] == "gap" for event in ours(*gap_case(seed)[:2], regions=gap_case(seed)[2]).events)
               for seed in range(cases))
    rows.append(("gap_after_unreadable_code", sum(gap_matches(seed) for seed in range(cases)), gaps, cases))
    return rows


# -- combinations: packet groups where they can fall ------------------------------------

# Packet groups (ipt_tracer.EXTRAS: timing, power events with EXSTOP's IP, EXSTOP, PTW
# with IP, PSB+) at each place they can fall, over the tracer options that make that
# place: between an indirect branch and its TIP (the groups that name no IP), right
# before an OVF, at the end of the trace.
COMBINATION_PLACES = {"branch": {"interrupt_every": 40, "uncompressed_ret_every": 2, "timing": True},
                      "overflow": {"overflow_every": 60}, "end": {"interrupt_every": 50}}
COMBINATIONS = [(where, group) for where in COMBINATION_PLACES
                for group in (T.NO_IP_EXTRAS if where == "branch" else T.EXTRAS)]
COMBINATION_SEEDS = 16
# Where libipt 2.0.5 lists instructions that did not run (the tracer's path says so),
# and the flow follows the path that ran.
LIBIPT_ARTIFACTS = {
    ("overflow", "psb"): "libipt lists code from the FUP of a PSB+ that an OVF right after it cut short",
    ("end", "psb"): "libipt walks on past a PSB+ that ends the trace, up to the next branch",
}


def combination_case(where, group, seed):
    """(program, trace, the instructions that ran) of one combination."""
    program = T.random_program(BASE, functions=30, seed=seed, syscalls=True)
    trace, executed = T.trace_program(program, 50 + seed * 37 % 600, seed=seed, extras=(group,),
                                      extras_where=(where,), **COMBINATION_PLACES[where])
    return program, trace, executed


@pytest.mark.parametrize("seed", range(COMBINATION_SEEDS))
@pytest.mark.parametrize("where,group", COMBINATIONS)
def test_packet_groups_anywhere_decode_as_libipt_and_as_the_code_ran(where, group, seed):
    program, trace, executed = combination_case(where, group, seed)
    result = ours(program, trace)
    assert result.problems == [] and result.instructions == executed
    if (where, group) in LIBIPT_ARTIFACTS:
        return
    events = []
    segments = libipt.instruction_segments(trace, {program.base: program.code}, events=events)
    assert [error for _, error in segments if error is not None] == []
    assert [ip for segment, _ in segments for ip in segment] == result.instructions
    theirs, mine = comparable_events(events, result)
    assert theirs == mine


@pytest.mark.parametrize("where,group", sorted(LIBIPT_ARTIFACTS))
def test_a_libipt_artifact_is_still_one(where, group):
    """Each listed artifact shows in some case (fixing the harness or libipt means removing it)."""
    differs = 0
    for seed in range(COMBINATION_SEEDS):
        program, trace, executed = combination_case(where, group, seed)
        ips, _ = libipt.instruction_flow(trace, {program.base: program.code})
        differs += ips != executed
    assert differs


if __name__ == "__main__":
    # match: same instructions, errors and events as libipt; exercised: the trace holds the class's feature
    print("%-56s %7s %9s %5s" % ("class", "match", "exercised", "cases"))
    for name, good, exercised, total in counts(int(sys.argv[1]) if len(sys.argv) > 1 else 50):
        print("%-56s %7d %9d %5d" % (name, good, exercised, total))


@pytest.mark.parametrize("pgd_ip", [None, BASE + 6])
@pytest.mark.parametrize("cpu", [None, (6, 0x4E, 3)])
def test_erratum_skd022_a_vm_entry_that_stops_tracing_ran(cpu, pgd_ip):
    """FUP + TIP.PGD at VMLAUNCH: an asynchronous disable, unless the CPU has SKD022,
    where the VM entry ran and tracing stopped after it (libipt's workaround)."""
    code = b"\x90\x85\xc0\x0f\x01\xc2\x90\x90"  # nop; test eax, eax; vmlaunch; nop; nop
    program = type("Program", (), {"base": BASE, "code": code})
    writer = T.PacketWriter()
    writer.psb_plus(BASE)
    writer.fup(BASE + 3)
    writer.pgd(pgd_ip)
    trace = writer.bytes()
    events = []
    segments = libipt.instruction_segments(trace, {BASE: code}, cpu, events=events)
    result = ours(program, trace, cpu)
    assert result.instructions == segments[0][0] == ([BASE, BASE + 1, BASE + 3] if cpu else [BASE, BASE + 1])
    if cpu:
        assert [(index, ip) for index, kind, ip in events if kind == "disabled"] == [
            (index, ip) for index, kind, _, ip in result.events if kind == "disabled"] == [(3, pgd_ip)]


# -- hand-built traces: the other shapes of each erratum's signature ---------------------

NOPS = b"\x90" * 32 + b"\xff\xe0"  # and jmp rax: the straight line ends where trace is needed


def decode_alike(trace, code, cpu):
    """Decode ``trace`` over ``code`` at BASE with both decoders; assert they agree on the
    instructions, the events and whether decoding failed.  Returns (instructions, failed,
    libipt's events)."""
    program = type("Program", (), {"base": BASE, "code": code})
    events = []
    segments = libipt.instruction_segments(trace, {BASE: code}, cpu, events=events)
    ips = [ip for segment, _ in segments for ip in segment]
    failed = any(error is not None for _, error in segments)
    result = ours(program, trace, cpu)
    assert result.instructions == ips
    assert bool(result.problems.errors) == failed
    # libipt's asynchronous disable is a disable too (its IP field is the TIP.PGD's)
    kinds = {"async_disabled": "disabled", "disabled": "disabled", "enabled": "enabled",
             "async_branch": "interrupt", "overflow": "overflow"}
    assert [(index, kinds[kind]) for index, kind, _ in events if kind in kinds] == [
        (index, kind) for index, kind, _, _ in result.events if kind in kinds.values()]
    return ips, failed, events


def writer_at(ip):
    writer = T.PacketWriter()
    writer.psb_plus(ip)
    return writer


def async_disable(writer, ip):
    writer.fup(ip)
    writer.pgd(None)
    return writer.bytes()


@pytest.mark.parametrize("cpu", [None, BROADWELL])
def test_erratum_bdm70_a_psb_fup_right_before_tip_pge_is_ignored(cpu):
    """Syncing at a PSB+ whose FUP precedes TIP.PGE: with BDM70 tracing starts at the
    TIP.PGE; without, libipt fails (tracing is already on)."""
    writer = writer_at(BASE + 2)
    writer.pge(BASE + 4, uncompressed=True)
    ips, failed, _ = decode_alike(async_disable(writer, BASE + 6), NOPS, cpu)
    assert (ips, failed) == (([BASE + 4, BASE + 5], False) if cpu else ([], True))


def test_erratum_bdm70_the_ignored_fup_does_not_count_for_ip_compression():
    """libipt skips the FUP's IP too: a TIP.PGE compressed against it gets the upper bits
    of no IP, in both decoders."""
    writer = writer_at(BASE + 2)
    writer.pge(BASE + 4)  # two bytes: 0x1004 once the FUP is ignored
    trace = async_disable(writer, BASE + 6)
    events = []
    libipt.instruction_segments(trace, {BASE: NOPS}, BROADWELL, events=events)
    result = ours(type("Program", (), {"base": BASE, "code": NOPS}), trace, BROADWELL)
    assert [ip for _, kind, ip in events if kind == "enabled"] == [0x1004]
    assert [ip for _, kind, _, ip in result.events if kind == "enabled"] == [0x1004]


@pytest.mark.parametrize("cpu", [None, BROADWELL])
def test_a_psb_fup_while_tracing_is_off_does_not_turn_it_on(cpu):
    """After TIP.PGD, a PSB+ with FUP (not followed by TIP.PGE): libipt is stuck and
    fails (its status update carries the FUP's IP, not where tracing stopped)."""
    writer = writer_at(BASE)
    writer.fup(BASE + 1)
    writer.pgd(BASE + 3)
    writer.psb_plus(BASE + 6)
    writer.tnt(True)
    writer.psb_plus(BASE + 8)  # decoding starts again here, and the trace ends: no instruction
    ips, failed, _ = decode_alike(writer.bytes(), NOPS, cpu)
    assert (ips, failed) == ([BASE], True)


def test_a_psb_fup_where_tracing_stopped_is_only_status():
    """The FUP names the IP where tracing stopped: libipt goes on waiting for TIP.PGE."""
    writer = writer_at(BASE)
    writer.fup(BASE + 1)
    writer.pgd(None)
    writer.psb_plus(BASE + 1)
    writer.pge(BASE + 8, uncompressed=True)
    ips, failed, _ = decode_alike(async_disable(writer, BASE + 10), NOPS, None)
    assert (ips, failed) == ([BASE, BASE + 8, BASE + 9], False)


def overflow_then(*packets):
    """A trace that overflows at BASE + 1, then ``packets`` (writer method, arguments)."""
    writer = writer_at(BASE)
    writer.ovf()
    for name, arguments in packets:
        getattr(writer, name)(*arguments)
    return writer


@pytest.mark.parametrize("cpu", [None, SKYLAKE])
@pytest.mark.parametrize("shape,resumes_at", [
    ([("tip", (BASE + 8,))], BASE + 8),
    ([("raw", (b"\x99\x01",)), ("tip", (BASE + 8,))], BASE + 8),
    ([("psb_plus", (BASE + 8,))], BASE + 8),
    ([("pgd", (None,)), ("pge", (BASE + 6,))], BASE + 6),
])
def test_erratum_skd010_an_overflow_that_lost_its_fup(cpu, shape, resumes_at):
    """OVF without FUP, then a TIP, a PSB+ with FUP or a TIP.PGD: with SKD010 tracing
    resumes there (after the TIP.PGD: at the TIP.PGE); without, a TIP or TIP.PGD right
    after the OVF fails, and a PSB+ FUP does not resume tracing."""
    trace = async_disable(overflow_then(*shape), BASE + 12)
    ips, failed, _ = decode_alike(trace, NOPS, cpu)
    if cpu:
        assert (ips, failed) == (list(range(resumes_at, BASE + 12)), False)
    elif shape[0][0] == "psb_plus":
        assert (ips, failed) == ([], True)


@pytest.mark.parametrize("cpu", [None, APOLLO_LAKE])
@pytest.mark.parametrize("then,applies", [
    ([("pge", (BASE + 6, True))], True),
    ([("psb_plus", (None,)), ("pge", (BASE + 6, True))], True),
    ([("tnt", (True,))], False),
])
def test_erratum_apl12_a_fup_after_an_overflow_while_tracing_is_off(cpu, then, applies):
    """OVF + FUP, then TIP.PGE or a PSB+ without FUP (tracing was off): with APL12 the
    FUP is skipped and tracing resumes at the TIP.PGE; followed by TNT the FUP stands."""
    trace = async_disable(overflow_then(("fup", (BASE + 2,)), *then), BASE + 12)
    ips, failed, _ = decode_alike(trace, NOPS, cpu)
    if cpu and applies:
        assert (ips, failed) == (list(range(BASE + 6, BASE + 12)), False)


@pytest.mark.parametrize("cpu", [None, SKYLAKE])
def test_a_tip_pgd_without_ip_binds_to_mov_cr3(cpu):
    """nop; mov cr3, rax; nop; jmp rax: tracing stopped after the MOV CR3."""
    code = b"\x90\x0f\x22\xd8\x90\xff\xe0" + NOPS
    writer = writer_at(BASE)
    writer.pgd(None)
    writer.pge(BASE + 7)
    ips, failed, events = decode_alike(async_disable(writer, BASE + 9), code, cpu)
    assert (ips, failed) == ([BASE, BASE + 1, BASE + 7, BASE + 8], False)
    assert [(index, kind) for index, kind, _ in events if kind in ("disabled", "enabled")] == [
        (2, "disabled"), (2, "enabled")]


PIP = b"\x02\x43" + ((0xA000 >> 5) << 1).to_bytes(6, "little")  # CR3 0xa000


@pytest.mark.parametrize("case", ["mov cr3", "far call", "two pips, one mov cr3, then the end"])
def test_a_pip_binds_to_the_next_mov_cr3_or_far_branch_and_holds_the_end_back_until_it_does(case):
    """nop, mov cr3, rax or call ptr [rax] (far), nop, nop, jmp rax: a PIP's paging event
    follows the first MOV CR3 or far branch; a PIP still unbound at the end of the trace
    keeps libipt decoding (to the jmp, which it decodes, then meets the end)."""
    far = case == "far call"
    code = (b"\x90\xff\x18\x90\x90" if far else b"\x90\x0f\x22\xd8\x90") + b"\x90\xff\xe0" + NOPS
    writer = writer_at(BASE)
    writer.raw(PIP * (2 if case.startswith("two") else 1))
    if case.startswith("two"):
        trace = writer.bytes()
    else:
        writer.tip(BASE + 8)
        trace = async_disable(writer, BASE + 10)
    ips, failed, events = decode_alike(trace, code, None)
    paging = [(index, "paging") for index, kind, _ in events if kind in ("paging", "async_paging")]
    program = type("Program", (), {"base": BASE, "code": code})
    assert paging == [(index, kind) for index, kind, _, _ in ours(program, trace).events if kind == "paging"]
    assert paging == [(2, "paging")]
    if case.startswith("two"):
        assert (ips, failed) == ([BASE, BASE + 1, BASE + 4, BASE + 5, BASE + 6], False)


@pytest.mark.parametrize("followed", [False, True])
@pytest.mark.parametrize("branch", [b"\xff\xe0", b"\xc3", b"\xff\x20", b"\xff\x28", b"\x48\xff\x28", b"\xff\x18"])
def test_a_tip_pgd_without_ip_binds_to_far_branches_only(branch, followed):
    """At a near indirect jmp (jmp rax, jmp qword ptr [rax]) or ret libipt fails the
    branch, which it had decoded (silently when the TIP.PGD ends the trace); at a far
    jmp or call through memory (jmp ptr [rax], ljmp [rax], call ptr [rax]) tracing stops
    after it.  Both list the branch."""
    writer = writer_at(BASE)
    writer.pgd(None)
    if followed:
        writer.pge(BASE + 8)
        writer.fup(BASE + 9)
        writer.pgd(None)
    ips, failed, _ = decode_alike(writer.bytes(), b"\x90" + branch + NOPS, None)
    far = branch in (b"\xff\x28", b"\x48\xff\x28", b"\xff\x18")
    assert ips[:2] == [BASE, BASE + 1]
    assert failed == (followed and not far)


@pytest.mark.parametrize("call", [b"\xff\x18", b"\x48\xff\x18", b"\xff\x10"])
def test_only_a_near_call_feeds_ret_compression(call):
    """call ptr [rax] and lcall [rax] are far calls: they take their TIP but, as in
    libipt, push nothing for a compressed RET; call qword ptr [rax] is near and does."""
    handler = BASE + 0x40
    code = call + b"\x90" * (0x40 - len(call)) + b"\xc3"
    writer = writer_at(BASE)
    writer.tip(handler)
    writer.tnt(True)  # the RET, compressed
    ips, failed, _ = decode_alike(async_disable(writer, BASE + len(call) + 1), code, None)
    if call == b"\xff\x10":
        assert (ips, failed) == ([BASE, handler, BASE + len(call)], False)
    else:
        assert (ips, failed) == ([BASE, handler], True)  # the RET (decoded) finds no call to return to


@pytest.mark.parametrize("branch", [b"\xc3", b"\xff\xe0"])
@pytest.mark.parametrize("mode_first", [False, True])
def test_a_mode_exec_binds_to_the_tip_right_after_it(branch, mode_first):
    """ret or jmp rax, then jz: TNT, TIP is a deferred TIP after the jz's bit (for the
    ret, a compressed return with nothing to return to: libipt decoded the ret, then
    failed); MODE.Exec, TNT, TIP fails in libipt, which binds a MODE.Exec to the TIP that
    follows it, as it reads ahead, before it decodes the branch."""
    target = BASE + 0x10
    code = branch + b"\x90" * (0x10 - len(branch)) + b"\x74\x02" + NOPS
    writer = writer_at(BASE)
    if mode_first:
        writer.raw(b"\x99\x01")
    writer.tnt(True)
    writer.tip(target)
    ips, failed, _ = decode_alike(async_disable(writer, BASE + 0x18), code, None)
    if mode_first:
        assert (ips, failed) == ([], True)
    elif branch == b"\xc3":
        assert (ips, failed) == ([BASE], True)
    else:
        assert (ips, failed) == ([BASE, target] + list(range(BASE + 0x14, BASE + 0x18)), False)


@pytest.mark.parametrize("split", [False, True])
def test_a_deferred_tip_after_held_bits_fails_when_a_tnt_packet_follows_them(split):
    """jz, jmp rax, then two jz at the target: the TNT bits of the jz after the jmp come
    before its TIP.  In one TNT packet with the first jz's bit they are held bits and
    the TIP is deferred; with the last bit in a packet of its own, libipt meets a TNT
    packet while it still holds a bit, and fails the jmp."""
    target = BASE + 0x10
    code = b"\x74\x00\xff\xe0" + b"\x90" * 12 + b"\x74\x00\x74\x00" + NOPS
    writer = writer_at(BASE)
    writer.tnt(False)
    writer.tnt(True)
    if split:
        writer.flush()
    writer.tnt(True)
    writer.tip(target)
    ips, failed, _ = decode_alike(async_disable(writer, BASE + 0x18), code, None)
    assert failed == split
