"""``ipt flow --decoder libipt`` gives the same JSON and text as the Python decoder
(the reference): the whole documents are compared (instructions, events with their
trace offsets, problems, counts) over

* Intel's suite: every flow test that is applicable (tests/test_ipt_intel_suite.py),
  with each of its CPUs; the ``--resync-on-error`` tests without that option, which
  libipt 2.0 does not have;
* the generated cases of tests/test_ipt_differential.py: its classes, its compared
  runs (the erratum classes with and without their CPU), its packet combinations;

through the library, and through the command line (JSON and text, every view) for a
few.  What differs by libipt 2.0.5's conventions is one rule each, stated here and
asserted (a rule no case needs any more is removed):

* BLOCKS: ``blocks`` counts the basic blocks each decoder disassembled.  The back end
  builds the blocks its instructions lie in and the ones the Python walk stands at
  (where an event resumes, where the code needs trace past the end of the trace), so
  the counts are equal, but where the Python walk went on past the last trace data
  before an OVF or an error and dropped what it walked (libipt never decodes that
  code), or looked along the code for a transaction abort's IP (the BDM64
  workaround): there the back end's count is smaller.
* ERRORS: an error is the same kind of problem after the same instructions, in each
  decoder's own words, at its own code address and trace offset (where libipt's
  decoder stood when it failed).

Tests that still differ otherwise are listed by family in DIFFERS (a ratchet: each
still differs; fixing one means removing it).
"""

import copy
import io
import json

import pytest

import test_ipt_differential as differential
import test_ipt_intel_suite as suite
from dbgext.cli import main
from dbgext.ipt import reconstruct_flow
from dbgext.ipt.errata import parse_cpu
from test_ipt_libipt import loaded_library

# Intel-suite flows whose documents differ, by family.
DIFFERS_BY_FAMILY = {
    "libipt 2.0.5's errata table does not know some of the test's CPUs (upstream's, in errata.py, does), "
    "so it applies no workaround for them":
        ("apl11", "bdm70-psb_fup-tip_pge", "bdm70-tip_pgd-psb_fup-tip_pge", "skd022", "skz84"),
    "libipt 2.0 does not know the TRIG, CFE and EVD packets, nor MODE.Exec's IF bit (an unknown opcode, "
    "or a trace out of step)":
        ("exstop-trig", "fup-tip-trig", "mode-trig-trig", "psb-fup-ptw-trig", "psb-fup-trig", "tip-trig",
         "tip_pge-trig", "tnt-trig", "trig", "trig-fup", "ptet", "ptet-evd_cr2-cfe_iret", "ptet-evd_cr2-evd_vmxq",
         "ptet-evd_vmxq-cfe_intr", "ptet-evd_vmxr-cfe_rsm", "ptet-evd_vmxr-evd-cr2", "ptet-init-sipi",
         "ptet-int-eretu", "ptet-int-int-erets-eretu", "ptet-int-iret", "ptet-int-iret-cpl_0",
         "ptet-int-iret-cpl_3", "ptet-mode_exec-if", "ptet-mode_exec-spurious", "ptet-smi-rsm", "ptet-uint-uiret",
         "ptet-vmexit-vmentry", "ptet-vmexit-vmentry-nonroot", "ptet-vmexit-vmentry-root"),
    "libipt 2.0's instruction decoder does not know JMPABS, ERETU or ERETS as branches":
        ("int-eretu", "int-eretu-cpl_0", "tip-jmpabs", "tip_pgd-jmpabs"),
    "libipt 2.0.5 lists code after a TIP.PGE that follows power events while tracing is off, where "
    "upstream's ptxed lists none, and fails on unmapped code":
        ("tip_pgd-mwait-pwre-exstop-pwrx-tip_pge",),
    "libipt 2.0.5 binds a PTW without IP to the PTWRITE that runs next (its IP, its instruction index); "
    "drops an EXSTOP whose FUP an OVF replaced (upstream ptxed and the Python decoder list it without IP)":
        ("mwait-pwre-exstop_ip-ovf", "tip_pge-ptw-tip_pgd"),
    "code that cannot be read (also past the end of the trace, where a PIP still pending has both decode "
    "on): the Python decoder reports a gap and goes on at the next packet that names an IP; libipt fails "
    "until the next PSB":
        ("ptxed-resync-nomap-fup-tip", "ptxed-resync-nomap-mode_exec-fup", "ptxed-resync-nomap-mode_tsx-eos",
         "ptxed-resync-nomap-mode_tsx-fup-tip", "ptxed-resync-nomap-mode_tsx-tip_pgd", "ptxed-resync-nomap-ovf-fup",
         "ptxed-resync-nomap-psb", "ptxed-resync-nomap-ptw-fup", "ptxed-resync-nomap-ptw-tip",
         "ptxed-resync-nomap-tip", "ptxed-resync-nomap-tip_pgd", "ptxed-resync-nomap-tip_pge",
         "ptxed-resync-psb-nomap-psb", "pip-pip_mov_cr3-fail"),
}
DIFFERS = {name: family for family, names in DIFFERS_BY_FAMILY.items() for name in names}
SUITE_COMPARED = [name for name in suite.FLOW_TESTS if suite.not_applicable(name) is None]
GENERATED_SEEDS = 8
GENERATED_RUNS = [(name, differential.CLASSES[name][1]) for name in sorted(differential.CLASSES)] \
    + differential.COMPARED_RUNS
COMBINATIONS = [combination for combination in differential.COMBINATIONS
                if combination not in differential.LIBIPT_ARTIFACTS]


def documents(trace, image, base, cpu=None):
    """{decoder: the ``ipt flow --json`` document} of ``trace`` over the code file ``image`` at ``base``."""
    loaded_library()
    return {decoder: reconstruct_flow(data=trace, images=[(str(image), base)], cpu=cpu, decoder=decoder).as_dict()
            for decoder in ("python", "libipt")}


def walked_past_the_trace(document):
    """Whether the Python walk may have built blocks libipt never decodes (BLOCKS)."""
    return ("bdm64" in document["errata"] or any(problem["severity"] == "error" for problem in document["problems"])
            or any(event["kind"] == "overflow" for buffer in document["buffers"] for event in buffer["events"]))


def in_own_words(problem):
    return dict(problem, message=None, address=None, offset=None) if problem["severity"] == "error" else problem


def with_the_rules(ours, theirs):
    """(ours, theirs, the rules that made them equal) with BLOCKS and ERRORS applied."""
    ours, theirs = copy.deepcopy(ours), copy.deepcopy(theirs)
    used = set()
    for mine, other in zip(ours["buffers"], theirs["buffers"]):
        if other["blocks"] < mine["blocks"] and walked_past_the_trace(ours):
            other["blocks"] = mine["blocks"]
            used.add("BLOCKS")
    worded = [[in_own_words(problem) for problem in document["problems"]] for document in (ours, theirs)]
    if ours["problems"] != theirs["problems"] and worded[0] == worded[1]:
        used.add("ERRORS")
    ours["problems"], theirs["problems"] = worded
    return ours, theirs, used


def suite_documents(name):
    """[(cpu, documents)] of one suite test, with each of its CPUs."""
    found = suite.directives(name)
    trace = (suite.SUITE / (name + ".pt")).read_bytes()
    return [(cpu, documents(trace, suite.SUITE / (name + ".bin"), found["org"],
                            parse_cpu(cpu) if cpu and cpu != "0/0" else None)) for cpu in suite.cpus(name)]


def agree(both):
    ours, theirs, _ = with_the_rules(both["python"], both["libipt"])
    return theirs == ours


@pytest.mark.parametrize("name", [name for name in SUITE_COMPARED if name not in DIFFERS])
def test_a_suite_flow_gives_the_same_document_with_either_decoder(name):
    for cpu, both in suite_documents(name):
        ours, theirs, _ = with_the_rules(both["python"], both["libipt"])
        assert (cpu, theirs) == (cpu, ours)


@pytest.mark.parametrize("name", sorted(DIFFERS))
def test_a_suite_flow_listed_as_differing_still_differs(name):
    assert name in SUITE_COMPARED
    assert not all(agree(both) for _, both in suite_documents(name)), \
        "%s agrees now: remove it from DIFFERS" % name


@pytest.fixture
def image_file(tmp_path):
    def write(code):
        path = tmp_path / "code.bin"
        path.write_bytes(code)
        return path
    return write


@pytest.mark.parametrize("name,cpu", GENERATED_RUNS)
def test_a_generated_flow_gives_the_same_document_with_either_decoder(name, cpu, image_file):
    for seed in range(GENERATED_SEEDS):
        program, trace = differential.compared_case(name, seed)
        both = documents(trace, image_file(program.code), program.base, cpu)
        ours, theirs, _ = with_the_rules(both["python"], both["libipt"])
        assert (seed, theirs) == (seed, ours)


@pytest.mark.parametrize("where,group", COMBINATIONS)
def test_packet_groups_anywhere_give_the_same_document_with_either_decoder(where, group, image_file):
    for seed in range(GENERATED_SEEDS):
        program, trace, _ = differential.combination_case(where, group, seed)
        both = documents(trace, image_file(program.code), program.base)
        ours, theirs, _ = with_the_rules(both["python"], both["libipt"])
        assert (seed, theirs) == (seed, ours)


def test_each_rule_is_needed_and_the_back_ends_count_of_blocks_is_never_larger():
    """BLOCKS and ERRORS each change some document of the suite; where BLOCKS does not
    apply the counts are equal, where it does the back end's is smaller."""
    used = set()
    for name in SUITE_COMPARED:
        if name in DIFFERS:
            continue
        for _, both in suite_documents(name):
            used |= with_the_rules(both["python"], both["libipt"])[2]
            for mine, other in zip(both["python"]["buffers"], both["libipt"]["buffers"]):
                assert other["blocks"] <= mine["blocks"], name
    assert used == {"BLOCKS", "ERRORS"}


# -- the command ----------------------------------------------------------------------------

def run_flow(name, *options):
    """(exit code, output) of ``ipt flow`` over a suite test."""
    argv = ["ipt", "flow", "--trace", str(suite.SUITE / (name + ".pt")), "--image",
            "%s@%x" % (suite.SUITE / (name + ".bin"), suite.directives(name)["org"])] + list(options)
    stream = io.StringIO()
    code = main(argv, stream=stream)
    return code, stream.getvalue()


@pytest.mark.parametrize("view", ["instructions", "calltree", "functions", "path"])
@pytest.mark.parametrize("name", ["tip_pgd-direct_call", "fup-pip-vmcs-tip_pgd", "tsx-abort", "ovf-fup",
                                  "call_direct-ret_compressed", "ptw-fup"])
def test_the_command_gives_the_same_json_and_text_with_either_decoder(name, view):
    loaded_library()
    outputs = {}
    for decoder in ("python", "libipt"):
        code, text = run_flow(name, "--view", view, "--decoder", decoder)
        json_code, document = run_flow(name, "--view", view, "--decoder", decoder, "--json")
        assert code == json_code == 0
        outputs[decoder] = (text, json.loads(document))
    assert outputs["libipt"] == outputs["python"]
