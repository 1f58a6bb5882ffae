"""The libipt back end (dbgext.ipt.libipt, ``ipt flow --decoder libipt``) against
dbgext's own decoder, which remains the reference.

* Intel's suite: on every flow test where dbgext agrees with ptxed
  (tests/test_ipt_intel_suite.py), with each of the test's CPUs, the back end lists
  the same instruction addresses and the same events (a "disabled" event's IP and
  "sync" aside: see ``comparable``), except where libipt 2.0.5 itself differs from upstream
  (LIBIPT_2_0_DIFFERS, by family; a ratchet: each still differs);
* the generated cases of tests/test_ipt_differential.py (its classes, its erratum
  classes with and without their CPU, its packet combinations): the same instructions
  and events;
* the same JSON and text from the command line, but for the blocks built (the back end
  builds none) and the events' trace offsets (libipt's decoder is past the packet);
* where the library cannot be loaded, one line says which library and how to get it
  (no library needed: a bogus path); a library of another major version is refused in
  one line; nothing loads libipt at import.
"""

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import test_ipt_differential as differential
import test_ipt_intel_suite as suite
from dbgext.cli import main
from dbgext.errors import BadInput, UnreadableMemory
from dbgext.ipt import libipt, libipt_api, reconstruct_flow
from dbgext.ipt.errata import cpu_errata, parse_cpu
from dbgext.ipt.flow import CodeImage, decode_flow
from requirements import need_library

REPO = Path(__file__).resolve().parents[1]

# Intel-suite flows where libipt 2.0.5 (the installed library) differs from upstream
# libipt, which the suite and the Python decoder follow.
LIBIPT_2_0_DIFFERS_BY_FAMILY = {
    "libipt 2.0.5's errata table does not know some of the test's CPUs (upstream's, in errata.py, does), "
    "so it applies no workaround for them":
        ("apl11", "bdm70-psb_fup-tip_pge", "bdm70-tip_pgd-psb_fup-tip_pge", "skd022", "skz84"),
    "libipt 2.0 does not know the TRIG, CFE and EVD packets, nor MODE.Exec's IF bit (an unknown opcode, "
    "or a trace out of step)":
        ("exstop-trig", "fup-tip-trig", "mode-trig-trig", "psb-fup-ptw-trig", "psb-fup-trig", "tip-trig",
         "tip_pge-trig", "tnt-trig", "trig", "trig-fup", "ptet", "ptet-init-sipi", "ptet-int-eretu",
         "ptet-int-int-erets-eretu", "ptet-int-iret", "ptet-int-iret-cpl_0", "ptet-int-iret-cpl_3",
         "ptet-mode_exec-if", "ptet-mode_exec-spurious", "ptet-smi-rsm", "ptet-uint-uiret", "ptet-vmexit-vmentry",
         "ptet-vmexit-vmentry-nonroot", "ptet-vmexit-vmentry-root"),
    "libipt 2.0's instruction decoder does not know JMPABS, ERETU or ERETS as branches":
        ("int-eretu", "int-eretu-cpl_0", "tip-jmpabs", "tip_pgd-jmpabs"),
    "libipt 2.0.5 lists code after a TIP.PGE that follows power events while tracing is off, where "
    "upstream's ptxed lists none, and fails on unmapped code":
        ("tip_pgd-mwait-pwre-exstop-pwrx-tip_pge",),
}
LIBIPT_2_0_DIFFERS = {name: family for family, names in LIBIPT_2_0_DIFFERS_BY_FAMILY.items() for name in names}
# Events that differ in where or whether they are reported: a PTW without IP is an event
# at no IP where the Python decoder reads it, libipt binds it to the PTWRITE that runs
# next (its IP and instruction index); an EXSTOP whose FUP an OVF replaced is no event in
# libipt 2.0.5, upstream ptxed and the Python decoder list it without IP.
EVENTS_DIFFER = frozenset(("mwait-pwre-exstop_ip-ovf", "tip_pge-ptw-tip_pgd"))


def loaded_library():
    """The back end's libipt, or skip the calling test (it is missing)."""
    try:
        library = libipt_api.load()
    except BadInput:
        library = None
    return need_library("libipt", library)


def comparable(result):
    """A FlowResult's events as (instruction index, kind, IP), a "disabled" event's IP
    left out (libipt often gives none), and no "sync" (libipt reports none: the back end
    infers one before the first event or instruction after a PSB+, which misses a PSB+
    that an OVF follows)."""
    return [(index, kind, None if kind == "disabled" else ip) for index, kind, _, ip in result.events
            if kind != "sync"]


def both(trace, regions, cpu=None):
    """(the Python decoder's FlowResult, the back end's) over ``regions`` [(base, bytes)],
    each with its errata workarounds for ``cpu``."""
    code = CodeImage(images=regions)
    ours = decode_flow(trace, code, errata=cpu_errata(cpu))
    theirs = libipt.LibiptFlowDecoder(code, cpu=cpu, library=loaded_library()).decode(trace)
    return ours, theirs


# -- Intel's suite ------------------------------------------------------------------------

def suite_flows(name):
    """[(cpu, Python decoder's result, back end's result)] of one suite test, each of its CPUs."""
    found = suite.directives(name)
    trace = (suite.SUITE / (name + ".pt")).read_bytes()
    regions = [(found["org"], (suite.SUITE / (name + ".bin")).read_bytes())]
    runs = []
    for cpu in suite.cpus(name):
        parsed = parse_cpu(cpu) if cpu and cpu != "0/0" else None
        runs.append((cpu,) + both(trace, regions, parsed))
    return runs


# Where dbgext agrees with ptxed, without ptxed's --resync-on-error (libipt 2.0 has no resync).
SUITE_COMPARED = [name for name in suite.FLOW_TESTS
                  if suite.not_applicable(name) is None and name not in suite.FLOW_DISAGREES
                  and "--resync-on-error" not in suite.directives(name)["ptxed"]]


def flow_facts(result, events=True):
    """What is compared: instructions, whether it failed, and (``events``) the events."""
    return result.instructions, bool(result.problems.errors), comparable(result) if events else None


@pytest.mark.parametrize("name", [name for name in SUITE_COMPARED if name not in LIBIPT_2_0_DIFFERS])
def test_suite_flow_through_libipt_lists_the_python_decoders_instructions_and_events(name):
    for cpu, ours, theirs in suite_flows(name):
        events = name not in EVENTS_DIFFER
        assert (cpu, flow_facts(theirs, events)) == (cpu, flow_facts(ours, events))


@pytest.mark.parametrize("name", sorted(LIBIPT_2_0_DIFFERS))
def test_a_suite_flow_listed_as_libipt_2_0s_difference_still_differs(name):
    assert name in SUITE_COMPARED
    assert any(flow_facts(theirs) != flow_facts(ours) for _, ours, theirs in suite_flows(name)), \
        "%s agrees now: remove it from LIBIPT_2_0_DIFFERS" % name


def test_the_events_listed_as_differing_still_differ():
    loaded_library()
    for name in sorted(EVENTS_DIFFER):
        assert any(comparable(theirs) != comparable(ours) for _, ours, theirs in suite_flows(name)), name


# -- generated cases ------------------------------------------------------------------------

GENERATED_SEEDS = 8


@pytest.mark.parametrize("name,cpu", [(name, ()) for name in sorted(differential.CLASSES)]
                         + differential.COMPARED_RUNS)
def test_generated_flows_through_libipt_equal_the_python_decoders(name, cpu):
    """The differential test's classes (its erratum classes with and without their CPU)."""
    for seed in range(GENERATED_SEEDS):
        program, trace = differential.compared_case(name, seed)
        run_cpu = differential.CLASSES[name][1] if cpu == () else cpu
        ours, theirs = both(trace, [(program.base, program.code)], run_cpu)
        assert (seed, theirs.instructions) == (seed, ours.instructions)
        assert (seed, comparable(theirs)) == (seed, comparable(ours))


@pytest.mark.parametrize("where,group", [combination for combination in differential.COMBINATIONS
                                         if combination not in differential.LIBIPT_ARTIFACTS])
def test_packet_groups_anywhere_decode_through_libipt_as_the_code_ran(where, group):
    for seed in range(GENERATED_SEEDS):
        program, trace, executed = differential.combination_case(where, group, seed)
        ours, theirs = both(trace, [(program.base, program.code)])
        assert (seed, theirs.instructions) == (seed, executed) == (seed, ours.instructions)
        assert (seed, comparable(theirs)) == (seed, comparable(ours))


# -- code from target memory (the image callback) -------------------------------------------

class CodeMemory(object):
    """A target whose memory holds ``code`` at ``base`` and nothing else, counting reads."""

    def __init__(self, base, code):
        self.base, self.code = base, code
        self.reads = 0

    def read(self, address, size):
        self.reads += 1
        offset = address - self.base
        if not 0 <= offset < len(self.code):
            raise UnreadableMemory(address)
        if offset + size > len(self.code):
            raise UnreadableMemory(self.base + len(self.code))
        return self.code[offset:offset + size]


@pytest.mark.parametrize("name", ["interrupts_and_psbs", "far_transfer_untraced", "overflow"])
def test_code_read_from_target_memory_through_the_callback_decodes_as_from_images(name):
    for seed in range(3):
        program, trace = differential.compared_case(name, seed)
        memory = CodeMemory(program.base, program.code)
        ours = decode_flow(trace, CodeImage(images=[(program.base, program.code)]))
        theirs = libipt.LibiptFlowDecoder(CodeImage(target=memory), library=loaded_library()).decode(trace)
        assert (seed, theirs.instructions) == (seed, ours.instructions) and ours.instructions
        assert memory.reads < len(ours.instructions)


@pytest.mark.parametrize("base", [0x5000, 0x5010, 0x5FF8])
def test_the_callbacks_reader_serves_code_inside_a_page_across_pages_and_up_to_its_end(base):
    """Pages are read whole where the target can; code that starts inside a page, crosses
    into the next or ends short of what libipt asks for is served as far as it goes."""
    code = bytes(range(1, 0x31))
    reader = libipt._CodeReader(CodeImage(target=CodeMemory(base, code)))
    assert reader.bytes_at(base, 15) == code[:15]
    assert reader.bytes_at(base + 2, 15) == code[2:17]
    assert reader.bytes_at(base + 0x28, 15) == code[0x28:]
    assert reader.bytes_at(base + 0x30, 15) == b"" and reader.bytes_at(base - 1, 15) == b""


def test_code_the_target_cannot_read_is_an_error_with_its_trace_offset():
    name = "tip_pgd-direct_call"
    trace = (suite.SUITE / (name + ".pt")).read_bytes()
    memory = CodeMemory(0x200000, b"\x90")
    result = libipt.LibiptFlowDecoder(CodeImage(target=memory), library=loaded_library()).decode(trace)
    assert result.instructions == []
    assert [(problem.kind, problem.message) for problem in result.problems] == [
        ("ipt_flow_error", "libipt: no memory mapped at this address")]
    assert result.problems[0].offset is not None


# -- the command ----------------------------------------------------------------------------

def run_flow(name, *options):
    """(exit code, output) of ``ipt flow`` over a suite test."""
    argv = ["ipt", "flow", "--trace", str(suite.SUITE / (name + ".pt")), "--image",
            "%s@%x" % (suite.SUITE / (name + ".bin"), suite.directives(name)["org"])] + list(options)
    stream = io.StringIO()
    code = main(argv, stream=stream)
    return code, stream.getvalue()


def without_blocks_and_event_offsets(document):
    """The document without what the back end says otherwise: the blocks built (it
    builds none) and where each event is in the trace (libipt's decoder is past the
    packet that gave it, dbgext names the packet)."""
    for buffer in document["buffers"]:
        buffer.pop("blocks")
    return _without_event_offsets(document)


def _without_event_offsets(value):
    if isinstance(value, list):
        return [_without_event_offsets(item) for item in value]
    if isinstance(value, dict):
        return {key: _without_event_offsets(item) for key, item in value.items()
                if not (key == "offset" and "kind" in value)}
    return value


_EVENT_OFFSET = re.compile(r"(\[.*), trace offset 0x[0-9a-f]+\]")


@pytest.mark.parametrize("view", ["instructions", "calltree", "functions", "path"])
@pytest.mark.parametrize("name", ["tip_pgd-direct_call", "tip_pgd-indirect_call", "fup-pip-vmcs-tip_pgd"])
def test_the_command_gives_the_same_json_and_text_with_either_decoder(name, view):
    loaded_library()
    outputs = {}
    for decoder in ("python", "libipt"):
        code, text = run_flow(name, "--view", view, "--decoder", decoder)
        _, document = run_flow(name, "--view", view, "--decoder", decoder, "--json")
        assert code == 0
        outputs[decoder] = ([_EVENT_OFFSET.sub(r"\1]", line) for line in text.splitlines()
                             if not line.startswith("blocks:")],
                            without_blocks_and_event_offsets(json.loads(document)))
    assert outputs["libipt"] == outputs["python"]


def test_32_bit_code_is_listed_in_its_mode_with_either_decoder(tmp_path):
    """inc eax, inc ecx, then jmp eax where a TIP.PGD without IP stops tracing: in
    64-bit mode 40 and 41 would be REX prefixes."""
    loaded_library()
    import ipt_support
    base = 0x1000
    image = tmp_path / "code32.bin"
    image.write_bytes(b"\x40\x41\xff\xe0")
    trace = ipt_support.encode([ipt_support.packet("psb"), ipt_support.packet("mode", leaf=0, bits=2),
                                ipt_support.packet("fup", ipc=3, ip=base), ipt_support.packet("psbend"),
                                ipt_support.packet("tip.pgd")])
    listings = {}
    for decoder in ("python", "libipt"):
        result = reconstruct_flow(data=trace, images=[(str(image), base)], decoder=decoder)
        listings[decoder] = [(row["ip"], row["text"]) for row in result.buffers[0].rows]
    assert listings["libipt"] == listings["python"] == [(0x1000, "inc eax"), (0x1001, "inc ecx")]


def test_resync_on_error_is_refused_with_libipt_in_one_line():
    error = io.StringIO()
    code = main(["ipt", "flow", "--trace", str(suite.SUITE / "tip-eos.pt"), "--image",
                 "%s@1000" % (suite.SUITE / "tip-eos.bin"), "--decoder", "libipt", "--resync-on-error"],
                stream=io.StringIO(), error_stream=error)
    assert code != 0 and error.getvalue().count("\n") == 1 and "needs the python decoder" in error.getvalue()


# -- loading --------------------------------------------------------------------------------

def test_a_library_that_cannot_be_loaded_is_named_in_one_line_with_how_to_get_it(monkeypatch):
    bogus = str(REPO / "no-such-dir" / "libipt.so.2")
    monkeypatch.setenv(libipt_api.LIBRARY_VARIABLE, bogus)
    with pytest.raises(BadInput) as raised:
        reconstruct_flow(data=(suite.SUITE / "tip-eos.pt").read_bytes(),
                         images=[(str(suite.SUITE / "tip-eos.bin"), 0x1000)], decoder="libipt")
    message = str(raised.value)
    assert "\n" not in message and bogus in message and "apt-get install libipt2" in message
    assert "python decoder" in message
    error = io.StringIO()
    code = main(["ipt", "flow", "--trace", str(suite.SUITE / "tip-eos.pt"), "--image",
                 "%s@1000" % (suite.SUITE / "tip-eos.bin"), "--decoder", "libipt"],
                stream=io.StringIO(), error_stream=error)
    assert code != 0 and error.getvalue().count("\n") == 1 and bogus in error.getvalue()


class _OtherMajorVersion(object):
    """Stands for a CDLL of libipt 1.6.1: every entry point accepts its declarations."""

    class _Function(object):
        def __call__(self, *arguments):
            return libipt_api.Version(1, 6, 1, 0, None)

    def __init__(self, name):
        self.name = name

    def __getattr__(self, name):
        function = self._Function()
        setattr(self, name, function)
        return function


def test_a_library_of_another_major_version_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(libipt_api.ctypes, "CDLL", _OtherMajorVersion)
    with pytest.raises(BadInput) as raised:
        libipt_api.load("libipt-1.6.so")
    message = str(raised.value)
    assert "\n" not in message and "libipt-1.6.so is version 1.6.1" in message and "2.x" in message
    assert "libipt-1.6.so" not in libipt_api._loaded


def test_importing_the_ipt_modules_loads_no_libipt():
    """Inside WinDbg the library is usually absent: it is loaded by --decoder libipt only."""
    script = ("import dbgext.ipt, dbgext.ipt.command, dbgext.ipt.libipt\n"
              "print(any('libipt.so' in line for line in open('/proc/self/maps')))")
    output = subprocess.run([sys.executable, "-c", script], cwd=str(REPO), capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=str(REPO)), check=True).stdout
    assert output.strip() == "False"
