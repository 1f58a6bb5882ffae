"""ISF symbol files: written by the scenario, read back by the symbol layer."""

import json

import pytest

from dbgext.errors import BadInput
from dbgext.target.base import Module
from dbgext.target.symbols import load_isf_directory, load_isf_file
from dbgext.testing.scenario import Scenario


def test_isf_files_round_trip_symbols_and_types(tmp_path):
    s = Scenario()
    s.add_module("nt", 0xFFFFF80000000000, 0x10000, image="ntoskrnl.exe")
    s.add_symbol("nt", "KeBugCheckEx", 0x1230)
    s.add_type("nt", "_KTHREAD", 0x430, {"StackLimit": 0x30})
    paths = s.write_symbols(str(tmp_path))
    document = json.loads(open(paths[0]).read())
    # volatility3's schema: module-relative symbol addresses, user types with field offsets
    assert document["symbols"]["KeBugCheckEx"] == {"address": 0x1230}
    assert document["user_types"]["_KTHREAD"]["fields"]["StackLimit"]["offset"] == 0x30
    table = load_isf_directory([str(tmp_path)])
    table.bind([Module("nt", 0xFFFFF80000000000, 0x10000)])
    assert table.address("nt!KeBugCheckEx") == 0xFFFFF80000001230
    assert table.field_offset("nt!_KTHREAD", "StackLimit") == 0x30


def test_the_file_name_names_the_module_when_metadata_does_not(tmp_path):
    path = tmp_path / "mydrv.json"
    path.write_text(json.dumps({"symbols": {"DriverEntry": {"address": 16}}, "user_types": {}}))
    assert load_isf_file(str(path)).module_name == "mydrv"


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"symbols": {"x": {"address": "zz"}}, '
                                     '"user_types": {"T": {"size": 1, "fields": {"f": {}}}}}'])
def test_a_broken_symbol_file_is_bad_input(tmp_path, content):
    path = tmp_path / "nt.json"
    path.write_text(content)
    with pytest.raises(BadInput):
        load_isf_file(str(path))
