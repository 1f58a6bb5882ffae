"""db, dd, dq, dps and lm through the dbgext CLI: WinDbg layouts, ranges, holes,
JSON, bad input."""

import io
import json

import pytest

from dbgext.address import TargetResolver, evaluate, parse_range
from dbgext.basic.memory import MAX_DISPLAY_BYTES
from dbgext.cli import main
from dbgext.errors import BadInput, SymbolNotFound
from dbgext.sample.scenario import Scenario
from pykd_support import DRIVER_BASE, NT_BASE, kernel_scenario


@pytest.fixture(scope="module")
def world():
    scenario, at = kernel_scenario()
    return scenario.target(), at


def run(target, *argv):
    stream = io.StringIO()
    code = main(list(argv), stream=stream, target=target)
    return code, stream.getvalue()


def lines(text):
    return text.rstrip("\n").split("\n")


# -- address expressions ---------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("1000", 0x1000), ("0x1000", 0x1000), ("fffff800`00001000", 0xFFFFF80000001000),
    ("0n4096", 4096), ("nt", NT_BASE), ("nt!KeBugCheckEx", NT_BASE + 0x2000),
    ("nt!KeBugCheckEx+10", NT_BASE + 0x2010), ("nt!KeBugCheckEx - 0x10", NT_BASE + 0x1FF0),
    ("DriverEntry", DRIVER_BASE + 0x1100), ("mydrv+0x1100", DRIVER_BASE + 0x1100),
])
def test_address_expressions(world, text, expected):
    target, _ = world
    assert evaluate(text, TargetResolver(target)) == expected


@pytest.mark.parametrize("text, error", [
    ("", BadInput), ("xyz!", BadInput), ("10+", BadInput), ("%%", BadInput), ("-5", BadInput),
    ("nt!Nope", SymbolNotFound), ("zz!Nope", SymbolNotFound), ("Nope", SymbolNotFound),
    ("1`0000`0000`0000`0000", BadInput),
])
def test_bad_address_expressions(world, text, error):
    target, _ = world
    with pytest.raises(error):
        evaluate(text, TargetResolver(target))


def test_ranges_are_counts_or_inclusive_end_addresses(world):
    resolver = TargetResolver(world[0])
    assert parse_range([], 0x1000, 4, 0x20, resolver) == 0x20
    assert parse_range(["L10"], 0x1000, 4, 0x20, resolver) == 0x10
    assert parse_range(["L", "0n10"], 0x1000, 4, 0x20, resolver) == 10
    assert parse_range(["L?20"], 0x1000, 4, 0x20, resolver) == 0x20
    assert parse_range(["100f"], 0x1000, 1, 0x80, resolver) == 0x10
    with pytest.raises(BadInput):
        parse_range(["fff"], 0x1000, 1, 0x80, resolver)
    with pytest.raises(BadInput):
        parse_range(["L0"], 0x1000, 1, 0x80, resolver)


# -- layouts -----------------------------------------------------------------------------

def test_db_shows_bytes_with_a_dash_and_an_ascii_column(world):
    target, at = world
    code, text = run(target, "db", "%x" % at.text, "L14")
    assert code == 0
    address = target.format_address(at.text)
    assert lines(text) == [
        address + "  48 65 6c 6c 6f 2c 20 57-69 6e 44 62 67 00 00 00  Hello, WinDbg...",
        target.format_address(at.text + 0x10) + "  00 00 00 00" + " " * 36 + "  ....",
    ]


def test_db_default_length_is_0x80_bytes(world):
    target, at = world
    code, text = run(target, "db", "0x%x" % at.page)
    assert code == 0 and len(lines(text)) == 8


def test_db_prints_question_marks_for_unreadable_bytes(world):
    target, at = world
    code, text = run(target, "db", "%x" % (at.hole - 8), "L10")
    assert code == 0
    assert lines(text) == [target.format_address(at.hole - 8)
                           + "  f8 f9 fa fb fc fd fe ff-?? ?? ?? ?? ?? ?? ?? ??  ........????????"]


def test_dd_shows_four_dwords_a_line_and_32_by_default(world):
    target, at = world
    code, text = run(target, "dd", "%x" % at.page)
    assert code == 0 and len(lines(text)) == 8
    assert lines(text)[0] == target.format_address(at.page) + "  03020100 07060504 0b0a0908 0f0e0d0c"


def test_dd_unreadable_dwords_are_eight_question_marks(world):
    target, at = world
    code, text = run(target, "dd", "%x" % (at.hole - 8), "L4")
    assert lines(text) == [target.format_address(at.hole - 8) + "  fbfaf9f8 fffefdfc ???????? ????????"]


def test_dq_uses_the_backtick_and_16_qwords_by_default(world):
    target, at = world
    code, text = run(target, "dq", "%x" % at.page)
    assert code == 0 and len(lines(text)) == 8
    assert lines(text)[0] == target.format_address(at.page) + "  07060504`03020100 0f0e0d0c`0b0a0908"
    code, text = run(target, "dq", "%x" % (at.hole - 8), "L2")
    assert lines(text) == [target.format_address(at.hole - 8) + "  fffefdfc`fbfaf9f8 ????????`????????"]


def test_dps_names_what_pointers_point_into(world):
    target, at = world
    code, text = run(target, "dps", "%x" % at.pointers, "L4")
    assert code == 0
    fmt = target.format_address
    assert lines(text) == [
        "%s  %s nt!KiSystemStartup+0x10" % (fmt(at.pointers), fmt(NT_BASE + 0x1010)),
        "%s  %s" % (fmt(at.pointers + 8), fmt(0x1234)),
        "%s  %s mydrv!DriverEntry" % (fmt(at.pointers + 16), fmt(DRIVER_BASE + 0x1100)),
        "%s  %s nt+0x10" % (fmt(at.pointers + 24), fmt(NT_BASE + 0x10)),
    ]


def test_dps_marks_unreadable_pointers(world):
    target, at = world
    code, text = run(target, "dps", "%x" % (at.hole - 8), "L2")
    assert lines(text)[1] == target.format_address(at.hole) + "  ????????`????????"


def test_lm_lists_start_end_name_and_image(world):
    target, _ = world
    code, text = run(target, "lm")
    assert code == 0
    assert "fffff800`00000000  fffff800`00020000  nt" in text and "ntoskrnl.exe" in text
    assert lines(text)[0].split() == ["start", "end", "module", "name", "image", "symbols"]
    assert "(isf symbols)" in lines(text)[2]
    code, text = run(target, "lm", "m", "my*")
    assert "mydrv.sys" in text and "ntoskrnl" not in text


def test_x86_targets_print_32_bit_addresses_and_pointers():
    s = Scenario("x86", "user")
    s.add_module("app", 0x400000, 0x2000, image="app.exe")
    s.add_symbol("app", "main", 0x1000)
    address = s.alloc(8)
    s.pack(address, "<II", 0x401004, 0)
    code, text = run(s.target(), "dps", "%x" % address, "L2")
    assert lines(text) == ["%08x  00401004 app!main+0x4" % address, "%08x  00000000" % (address + 4)]
    code, text = run(s.target(), "dq", "%x" % address, "L1")
    assert lines(text) == ["%08x  00000000`00401004" % address]


# -- bounds and bad input -------------------------------------------------------------------

def test_a_huge_length_is_clamped_with_a_note(world):
    target, at = world
    code, text = run(target, "db", "%x" % at.page, "L?ffffffff")
    assert code == 0
    assert lines(text)[0].startswith("note: length clamped to 0x%x bytes" % MAX_DISPLAY_BYTES)
    assert len(lines(text)) == 1 + MAX_DISPLAY_BYTES // 16


def test_reading_past_the_top_of_the_address_space_stops_there(world):
    target, _ = world
    code, text = run(target, "db", "ffffffff`fffffff8", "L20")
    assert code == 0 and len(lines(text)) == 1 and "?? ?? ??" in text


@pytest.mark.parametrize("argv, message", [
    (["db", "nt!Nope"], "error: unknown symbol 'nt!Nope'"),
    (["db", "12zz"], "error: bad token '12zz' in '12zz'"),
    (["dd", "2000", "1000"], "error: range end 1000 is below the start address 0x2000"),
    (["lm", "x"], "error: lm takes no arguments or 'm PATTERN'"),
])
def test_bad_input_is_one_line_without_traceback(world, argv, message):
    target, _ = world
    code, text = run(target, *argv)
    assert code == 1
    assert text.startswith(message) and len(lines(text)) == 1 and "Traceback" not in text


def test_an_x86_address_above_4gib_is_rejected():
    code, text = run(Scenario("x86", "user").target(), "db", "1`00000000")
    assert code == 1 and "outside the x86 address space" in text


# -- JSON --------------------------------------------------------------------------------

def test_json_output_of_memory_displays(world):
    target, at = world
    code, text = run(target, "dd", "%x" % (at.hole - 8), "L4", "--json")
    document = json.loads(text)
    assert document == {"schema_version": 1, "command": "dd", "address": at.hole - 8, "unit": 4, "count": 4,
                        "values": [0xFBFAF9F8, 0xFFFEFDFC, None, None], "clamped_from": None}


def test_json_output_of_dps_and_lm(world):
    target, at = world
    document = json.loads(run(target, "dps", "%x" % at.pointers, "L2", "--json")[1])
    assert document["entries"][0] == {"address": at.pointers, "value": NT_BASE + 0x1010,
                                      "symbol": "nt!KiSystemStartup+0x10"}
    assert document["entries"][1]["symbol"] is None
    document = json.loads(run(target, "lm", "--json")[1])
    assert document["modules"][0] == {"name": "nt", "start": NT_BASE, "end": NT_BASE + 0x20000,
                                      "size": 0x20000, "image": "ntoskrnl.exe", "symbols": "isf symbols",
                                      "symbol_file": None}


# -- offline over a real dump file ---------------------------------------------------------------

def test_db_over_a_kernel_dump_file_with_isf_symbols(tmp_path):
    scenario, at = kernel_scenario()
    path = str(tmp_path / "k.dmp")
    scenario.write_kernel_dump(path)
    scenario.write_symbols(path + ".symbols")
    stream = io.StringIO()
    code = main(["dps", "--dump", path, "%x" % at.pointers, "L1"], stream=stream)
    assert code == 0 and stream.getvalue().rstrip().endswith("nt!KiSystemStartup+0x10")
    stream = io.StringIO()
    code = main(["db", "--dump", path, "%x" % (at.hole - 4), "L8"], stream=stream)
    assert code == 0 and "fc fd fe ff ?? ?? ?? ??" in stream.getvalue()
