"""What a new user meets first, on the bundled sample dump: the README's own
commands give clean output, warnings and notes go to stderr (results to stdout),
filesystem mistakes are one-line errors, thread selection says what went wrong,
WinDbg's pseudo-registers work, numbers are in one base, and the demo does not
warn about itself."""

import io
import json
import os
import re

import pytest

import dbgext
from dbgext.cli import main
from dbgext.errors import EXIT_ERROR
from dbgext.sample import NT_BASE, build_sample_scenario

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    """(dump path, manifest contents) of the bundled sample."""
    directory = tmp_path_factory.mktemp("sample")
    assert main(["sample", "--out", str(directory)], stream=io.StringIO()) == 0
    with open(str(directory / "sample.json")) as handle:
        return str(directory / "sample.dmp"), json.load(handle)["contents"]


def run(argv):
    """(exit code, stdout, stderr) of ``dbgext argv``."""
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, stream=out, error_stream=err)
    return code, out.getvalue(), err.getvalue()


# -- ln ----------------------------------------------------------------------------------------------


def test_ln_on_a_symbol_lists_the_exact_match_by_name(sample):
    dump, _ = sample
    code, out, err = run(["ln", "--dump", dump, "nt!KeBugCheckEx"])
    assert code == 0 and err == ""
    assert out.splitlines()[1:] == ["Exact matches:", "    nt!KeBugCheckEx"]


# -- warnings and notes on stderr --------------------------------------------------------------------


@pytest.fixture(scope="module")
def headless(tmp_path_factory):
    """The sample with nt's PE headers wiped: stack walks warn about it."""
    scenario, _ = build_sample_scenario()
    scenario.write(NT_BASE, bytes(0x1000))
    path = str(tmp_path_factory.mktemp("headless") / "headless.dmp")
    scenario.write_kernel_dump(path)
    scenario.write_symbols(path + ".symbols")
    return path


@pytest.mark.parametrize("argv, diagnostic", [
    (["k"], "warning no_unwind_data"),
    (["stackuse", "thread"], "warning no_unwind_data"),
    (["db", "nt", "Lffffffff"], "note: length clamped to 0x10000 bytes"),
], ids=["k", "stackuse", "db"])
def test_warnings_and_notes_go_to_stderr_and_results_to_stdout(headless, argv, diagnostic):
    code, out, err = run(argv + ["--dump", headless])
    assert code == 0 and out
    assert diagnostic in err and "warning" not in out and "note:" not in out


def test_rtltrace_notes_go_to_stderr(sample):
    dump, contents = sample
    code, out, err = run(["rtltrace", "--dump", dump, "0x%x" % contents["rtltrace"]])
    assert code == 0 and "HashCounter overflow" in err and "note:" not in out


# -- filesystem errors -------------------------------------------------------------------------------


def test_sample_into_an_existing_file_is_a_one_line_error(tmp_path):
    existing = tmp_path / "taken"
    existing.write_text("mine")
    code, out, err = run(["sample", "--out", str(existing)])
    assert code == EXIT_ERROR and err.count("\n") == 1 and str(existing) in err and "Traceback" not in err
    assert existing.read_text() == "mine"


def test_demo_into_a_path_under_a_file_is_a_one_line_error():
    code, out, err = run(["demo", "--out", "/dev/null/x"])
    assert code == EXIT_ERROR and err.count("\n") == 1 and "/dev/null/x" in err


# -- threads -----------------------------------------------------------------------------------------


def test_k_on_a_thread_index_a_kernel_dump_does_not_have_names_the_index(sample):
    dump, _ = sample
    code, out, err = run(["k", "--dump", dump, "--thread", "~1"])
    assert code == EXIT_ERROR and out == ""
    assert err.strip() == "error: no thread '~1' in this target (1 threads with a context)"


def test_the_readme_quotes_thread_indexes_for_the_shell():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as handle:
        text = handle.read()
    assert re.findall(r"--thread ~", text) == []
    assert "--thread '~3'" in text


def address_of(dump, expression):
    """What ``dq EXPRESSION`` takes as its address."""
    code, out, err = run(["dq", "--dump", dump, expression, "L1", "--json"])
    assert code == 0, err
    return json.loads(out)["address"]


@pytest.mark.parametrize("pseudo, register", [("@$ip", "rip"), ("@$csp", "rsp")])
def test_the_instruction_and_stack_pointer_pseudo_registers(sample, pseudo, register):
    dump, _ = sample
    with dbgext.open(dump) as target:
        assert address_of(dump, pseudo) == target.register(register)


def test_thread_and_proc_pseudo_registers_of_a_kernel_dump_are_the_kthread_and_its_process(sample):
    dump, contents = sample
    assert address_of(dump, "@$thread") == contents["stackuse"]["thread"]
    assert address_of(dump, "@$proc") == contents["process"]
    assert address_of(dump, "@$proc+8") == contents["process"] + 8


def test_an_unknown_pseudo_register_is_named(sample):
    dump, _ = sample
    code, out, err = run(["db", "--dump", dump, "@$nosuch"])
    assert code == EXIT_ERROR and "@$nosuch" in err


# -- one number base ---------------------------------------------------------------------------------


def test_rtltrace_names_buckets_in_hex_as_its_bucket_option_takes_them(sample):
    dump, contents = sample
    database = "0x%x" % contents["rtltrace"]
    code, out, _ = run(["rtltrace", "--dump", dump, database])
    chain = re.search(r"longest chain (\d+) \(bucket (0x[0-9a-f]+)\)", out)
    assert code == 0 and chain, out
    code, listing, _ = run(["rtltrace", "--dump", dump, database, "--bucket", chain.group(2)])
    assert code == 0 and listing.startswith("Bucket %s (of 211) at " % chain.group(2))
    assert ": %s blocks (newest first)" % chain.group(1) in listing.splitlines()[0]


# -- --version ---------------------------------------------------------------------------------------


def test_version_prints_the_package_version():
    code, out, err = run(["--version"])
    assert code == 0 and out.strip() == "dbgext %s" % dbgext.__version__
    with open(os.path.join(ROOT, "pyproject.toml")) as handle:
        assert 'version = {attr = "dbgext.__version__"}' in handle.read()   # the one place it is written


# -- the demo ----------------------------------------------------------------------------------------


def test_the_demo_prints_no_warning_about_its_own_sample(tmp_path):
    code, out, err = run(["demo", "--out", str(tmp_path / "demo")])
    assert code == 0 and "warning" not in err and "warning" not in out and "image_unreadable" not in out + err


def test_the_samples_bugcheck_arguments_agree_with_its_stack(sample):
    dump, _ = sample
    with dbgext.open(dump) as target:
        arguments = target.info()["bugcheck"][1:]
        frames = dbgext.stacks.analyze(target).frames
        functions = [frame.function for frame in frames]
        for value in arguments:
            name = target.symbolize(value)
            if "!" in name and "+" in name:   # a code address: it is on the stack
                assert any(name.split("+")[0] == function.split("+")[0] for function in functions), (name, functions)
