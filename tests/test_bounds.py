"""Sizes and counts read from input are bounded by the bytes behind them
(docs/bounds.md): a PE directory reaching into a section's zero-fill is read only
as far as the file holds it, and a stack file's counts expand to at most
MAX_EXPANDED_EVENTS events.  The same inputs run as whole commands under the
memory and time limits in tests/test_fuzz_hostile.py."""

import json
import struct

import pytest

from dbgext.errors import BadInput
from dbgext.etwcache.streams import MAX_EXPANDED_EVENTS, load_stack_file
from dbgext.pe import PEImage
from dbgext.stacks.images import runtime_functions

from hostile import BSS_RVA, FUNCTION_CODE, RDATA_RVA, TEXT_RVA, _imports_sharing_one_thunk_table, hostile_pe


def image(directories, rdata=()):
    return PEImage.from_bytes(hostile_pe(directories, rdata), "hostile.sys")


def messages(pe):
    return [problem.message for problem in pe.problems]


def test_an_exception_directory_in_zero_fill_gives_no_entries_and_says_what_it_claimed():
    pe = image({3: (BSS_RVA, 0xFFFFFF00)})
    assert runtime_functions(pe) == []
    assert messages(pe) == ["hostile.sys: the exception directory claims 0xffffff00 bytes; the file holds 0 entries "
                            "of it"]


def test_an_exception_directory_running_off_its_section_keeps_the_entries_the_file_holds():
    entry = struct.pack("<III", TEXT_RVA, TEXT_RVA + len(FUNCTION_CODE), RDATA_RVA + 0x80)
    pe = image({3: (RDATA_RVA + 0x100, 0xFFFFFFF0)}, [(0x100 + 12 * i, entry) for i in range(21)])
    assert len(runtime_functions(pe)) == 0x100 // 12 and runtime_functions(pe)[0] == (
        TEXT_RVA, TEXT_RVA + len(FUNCTION_CODE), RDATA_RVA + 0x80)
    assert "the file holds 21 entries of it" in messages(pe)[0]


def test_a_relocation_directory_in_zero_fill_gives_no_sites_and_one_problem():
    pe = image({5: (BSS_RVA, 0xFFFFFF00)})
    assert pe.relocations == []
    assert messages(pe) == ["hostile.sys: the base relocation directory claims 0xffffff00 bytes; the file holds 0x0"]


def test_export_and_cfg_tables_in_zero_fill_are_unreadable_not_zeros():
    exports = bytearray(40)
    struct.pack_into("<IIIII", exports, 20, 0xFFFFF, 0xFFFFF, BSS_RVA, BSS_RVA, BSS_RVA)
    pe = image({0: (RDATA_RVA + 0x100, 40)}, [(0x100, bytes(exports))])
    assert pe.exports == {} and messages(pe) == ["hostile.sys: the export tables are not readable"]
    config = bytearray(0x94)
    struct.pack_into("<I", config, 0, len(config))
    struct.pack_into("<QQ", config, 0x80, pe.image_base + BSS_RVA, 0xFFFFFFFF)
    pe = image({10: (RDATA_RVA + 0x100, 0x94)}, [(0x100, bytes(config))])
    assert pe.guard_functions == [] and messages(pe) == [
        "hostile.sys: guard_function_table holds 4294967295 entries, 0 readable"]


def test_import_descriptors_sharing_one_thunk_table_read_no_more_thunks_than_the_image_holds():
    patches, rdata_size = _imports_sharing_one_thunk_table(descriptors=64, thunks=4000)
    pe = PEImage.from_bytes(hostile_pe({1: (RDATA_RVA + 0x100, 20 * 65)}, patches, rdata_size), "hostile.sys")
    assert len(pe.imports) == 4000   # one IAT: every descriptor names the same slots
    assert messages(pe) == ["hostile.sys: the import descriptors list more thunks than the image's bytes hold; "
                            "stopped at descriptor %d" % (sum(s.filled for s in pe._segments) // 8 // 4000)]


def test_read_backed_stops_where_the_file_s_bytes_end_read_partial_zero_fills_as_the_loader_does():
    pe = image({})
    assert pe.read_backed(BSS_RVA, 0x10) == b"" and pe.read_partial(BSS_RVA, 0x10) == bytes(0x10)
    assert len(pe.read_backed(RDATA_RVA + 0x1F0, 0x100)) == 0x10
    assert pe.read_backed(TEXT_RVA, 4) == FUNCTION_CODE[:4]


FRAMES = "fffff80000001000 7ff000001000"


def write(tmp_path, text):
    path = tmp_path / "stacks.txt"
    path.write_text(text)
    return str(path)


def test_stack_file_counts_replay_each_stack_that_many_times(tmp_path):
    stream = load_stack_file(write(tmp_path, "3: %s\n2: fffff80000002000\n" % FRAMES))
    assert len(stream) == 3 * 2 + 2 and len(stream.stacks) == 3


@pytest.mark.parametrize("text", ["0x4000000: %s\n" % FRAMES, "0xFFFFFFFF: %s\n" % FRAMES,
                                  json.dumps([{"frames": FRAMES.split(), "count": 0xFFFFFFFF}]),
                                  "".join("0x100000: fffff8000000%04x\n" % index for index in range(6))])
def test_stack_file_counts_past_max_expanded_events_are_refused_in_one_line(tmp_path, text):
    with pytest.raises(BadInput) as raised:
        load_stack_file(write(tmp_path, text))
    message = str(raised.value)
    assert "the counts add up to more than %d stack-walk events" % MAX_EXPANDED_EVENTS in message
    assert "\n" not in message


def test_a_negative_stack_file_count_is_refused(tmp_path):
    with pytest.raises(BadInput, match="bad count"):
        load_stack_file(write(tmp_path, "-5: %s\n" % FRAMES))


@pytest.mark.parametrize("text", ["[" * 100000, '{"stacks": ' * 100000])
def test_a_stack_file_nested_100000_deep_ends_in_one_line_nested_too_deeply(tmp_path, text):
    with pytest.raises(BadInput, match="invalid JSON: nested too deeply$"):
        load_stack_file(write(tmp_path, text))
