"""Bad input: truncated and malformed PE files, code pages missing from a dump, a
function that runs off its section, code that loops.  Clear messages naming the
address, the rest still analysed, bounded time."""

import io
import json

import pytest

from dbgext.cli import main
from dbgext.stackuse.callgraph import CallGraph, Program
from dbgext.stackuse.fixtures import Function, add_sample_driver, alloc_slots, build_pe, sample_driver_functions
from dbgext.pe import PEImage
from dbgext.sample.scenario import Scenario

from stackuse_support import analyse_built, function_named
from minidump_writer import write_minidump


def run(*argv):
    stream = io.StringIO()
    return main(list(argv), stream=stream), stream.getvalue()


@pytest.fixture
def driver_bytes():
    return build_pe("x64", sample_driver_functions(), imports=["ntoskrnl.exe!KeQueryTimeIncrement"]).data


def test_file_truncated_inside_its_sections_is_analysed_as_far_as_it_goes(driver_bytes, tmp_path):
    path = tmp_path / "cut.sys"
    image = PEImage.from_bytes(driver_bytes)
    rdata = [s for s in image.sections if s.name == ".rdata"][0]
    path.write_bytes(driver_bytes[:rdata.rva + 0x10])  # .text whole, .rdata cut, .pdata gone
    code, text = run("stackuse", "functions", "--pe", str(path))
    assert code == 0
    assert "file truncated: cut.sys ends inside section data at rva 0x%x" % (rdata.rva + 0x10) in text
    assert "pe_directory_unreadable" in text and "the exception directory" in text


def test_a_code_section_claiming_gigabytes_costs_only_the_bytes_the_file_holds():
    """A mutated MinGW x86 DLL the fuzz harness found (tests/data/fuzz): its section
    headers claim code sections of up to 1.8 GiB past 4 KiB of file, and the gap
    sweep (x86 has no .pdata) decoded and kept all that zero fill: 24 GB and more
    than five minutes.  Now it costs what the file holds."""
    import os
    import subprocess
    import sys
    path = os.path.join(os.path.dirname(__file__), "data", "fuzz", "pe-huge-code-section.dll")
    limited = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30)); "
               "from dbgext.cli import main; sys.exit(main(sys.argv[1:]))")
    result = subprocess.run([sys.executable, "-c", limited, "stackuse", "functions", "--pe", path, "--json"],
                            capture_output=True, text=True, timeout=300)  # a hang guard, not a speed check
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["schema_version"] == 1


@pytest.mark.parametrize("name", ["pe-callee-of-a-gap.dll", "pe-callee-found-when-refined.dll"])
def test_functions_lists_what_depth_lists_when_callees_turn_up_late(name):
    """Mutated MinGW x86 DLLs the fuzz harness found (tests/data/fuzz): a function
    called only from code the gap sweep found, or reached only once every callee's
    `ret N` was known, was listed by `functions` without a frame (--depth followed it)."""
    import os
    from dbgext.stackuse import analyze
    path = os.path.join(os.path.dirname(__file__), "data", "fuzz", name)
    listed = analyze(pe=path).records()
    deep = [dict((key, value) for key, value in record.items() if not key.startswith("depth"))
            for record in analyze(pe=path, depth=True).records()]
    assert listed == deep
    assert all(record["frame_size"] is not None or record["dynamic"] for record in listed if record["found_by"] == "call")


@pytest.mark.parametrize("content, message", [
    (b"", "truncated before the DOS header ends (0x0 bytes)"),
    (b"MZ" + b"\0" * 10, "truncated before the DOS header ends (0xc bytes)"),
    (b"hello, this is not an executable" * 4, "no MZ header"),
])
def test_files_that_are_not_pe_images_give_one_line(content, message, tmp_path):
    path = tmp_path / "bad.sys"
    path.write_bytes(content)
    code, text = run("stackuse", "functions", "--pe", str(path))
    assert code == 1
    assert text.startswith("error: bad.sys is not a usable PE image: ") and message in text
    assert text.count("\n") == 1


def test_headers_cut_short_and_missing_file(driver_bytes, tmp_path):
    path = tmp_path / "short.sys"
    path.write_bytes(driver_bytes[:0xA0])
    code, text = run("stackuse", "functions", "--pe", str(path))
    assert code == 1 and "optional header truncated" in text
    code, text = run("stackuse", "functions", "--pe", str(tmp_path / "absent.sys"))
    assert code == 1 and text.startswith("error: cannot read")


def test_a_huge_claimed_size_of_image_costs_nothing_and_the_code_is_still_analysed(driver_bytes):
    data = bytearray(driver_bytes)
    optional = int.from_bytes(data[0x3C:0x40], "little") + 24
    data[optional + 56:optional + 60] = (0xFFFFFFF0).to_bytes(4, "little")
    image = PEImage.from_bytes(bytes(data))
    assert image.size_of_image == 0xFFFFFFF0
    assert image.read(0x7FFF0000, 16) is None  # claimed, but nothing is there
    program = Program()
    module = program.add_image(image)
    CallGraph(program).analyse_all(module)
    assert sorted(f.frame_size for f in module.functions.values() if f.name) == sorted(
        f.frame_size for f in _analysed(driver_bytes).functions.values() if f.name)


def _analysed(data):
    program = Program()
    module = program.add_image(PEImage.from_bytes(data))
    CallGraph(program).analyse_all(module)
    return module


def test_code_page_missing_from_the_dump_is_reported_and_unwind_sizes_remain():
    scenario = Scenario("x64", "kernel")
    info = add_sample_driver(scenario)
    scenario.unmap(info["functions"]["DriverEntry"], 1)  # the driver's whole .text page
    target = scenario.target()
    program = Program(target)
    module = program.add_target_module(target.module_named("sampledrv"))
    graph = CallGraph(program)
    graph.analyse_all(module)
    assert module.functions[info["functions"]["Dispatch"]].frame_size == 0x228  # from .pdata/.xdata
    assert any(p.kind == "function_not_followed" and p.address == info["functions"]["DriverEntry"]
               and "code at 0x%x is not readable" % info["functions"]["DriverEntry"] in p.message
               for p in module.problems)
    bound = graph.bound(module.functions[info["functions"]["DriverEntry"]])
    assert (bound.status, bound.depth) == ("lower", 8 + 0x28)
    assert "is not readable" in bound.reasons[0]


def test_headers_missing_from_the_dump_is_a_clear_error(tmp_path):
    scenario = Scenario("x64", "kernel")
    info = add_sample_driver(scenario)
    scenario.unmap(info["base"], 1)
    dump = str(tmp_path / "holes.dmp")
    scenario.write_kernel_dump(dump)
    scenario.write_symbols(dump + ".symbols")
    code, text = run("stackuse", "functions", "--dump", dump, "--module", "sampledrv")
    assert code == 1
    assert text == "error: the PE headers of sampledrv at fffff801`23400000 are not in the target\n"
    code, text = run("stackuse", "functions", "--dump", dump, "--module", "nosuch")
    assert code == 1 and "no module named 'nosuch'" in text and "sampledrv" in text


def test_function_running_off_its_section_is_reported_and_bounded():
    runaway = Function("runaway", [b"\x90" * 16])  # no return: falls off the end of .text
    built = build_pe("x86", [runaway])
    program, module, graph = analyse_built(built, "x86")
    function = function_named(module, "runaway")
    assert function.body_problem == "runs off the code section at 0x%x" % (built.image_base + 0x1010)
    # Nothing after the section's end is code: the frame cannot be known.
    bound = graph.bound(function)
    assert bound.status == "unknown" and "runs off the code section" in bound.reasons[0]


def test_code_that_jumps_to_itself_terminates():
    spin = Function("spin", [b"\x48\x83\xec\x28", b"\xeb\xfe"], {"prolog_size": 4, "slots": alloc_slots(4, 0x28)})
    built = build_pe("x64", [spin])
    program, module, graph = analyse_built(built, "x64")
    function = function_named(module, "spin")
    assert (function.frame_size, graph.bound(function).value) == (0x28, 8 + 0x28)


def test_mutual_recursion_is_reported_as_a_cycle():
    ping = Function("ping", [b"\x48\x83\xec\x28", ("call", "pong"), b"\x48\x83\xc4\x28", b"\xc3"],
                    {"prolog_size": 4, "slots": alloc_slots(4, 0x28)})
    pong = Function("pong", [b"\x48\x83\xec\x38", ("call", "ping"), b"\x48\x83\xc4\x38", b"\xc3"],
                    {"prolog_size": 4, "slots": alloc_slots(4, 0x38)})
    program, module, graph = analyse_built(build_pe("x64", [ping, pong]), "x64")
    bound = graph.bound(function_named(module, "ping"))
    assert bound.status == "unbounded"
    assert bound.reasons[0] == "recursion: ping -> pong -> ping"
    assert [step[0].name for step in graph.chain(function_named(module, "ping"))] == ["ping", "pong", "ping"]


def test_module_claiming_a_4_gb_size_in_a_minidump_costs_what_its_pages_cost(tmp_path):
    import tracemalloc
    built = build_pe("x64", sample_driver_functions(), image_base=0x7FF600000000, name="claims.dll",
                     imports=["ntoskrnl.exe!KeQueryTimeIncrement"])
    scenario = Scenario("x64", "user")
    scenario.add_module("claims", 0x7FF600000000, built.size, image="claims.dll", content=built.data)
    scenario.modules[-1].size = 0xFFFFFFFF  # what the module list says; the dump holds a few pages
    dump = str(tmp_path / "claims.dmp")
    write_minidump(scenario, dump)
    tracemalloc.start()
    try:
        code, text = run("stackuse", "functions", "--dump", dump, "--module", "claims", "--json")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert code == 0
    assert {record["name"] for record in json.loads(text)["functions"]} >= {"DriverEntry", "Dispatch"}
    assert peak < 64 << 20
