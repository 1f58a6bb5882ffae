"""ISF symbol files: written by the scenario, read back by the symbol layer."""

import json

import pytest

from dbgext.errors import BadInput
from dbgext.target.base import Module
from dbgext.symbols.module import load_isf_file
from dbgext.symbols.table import load_isf_directory
from dbgext.sample.scenario import Scenario


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


# -- ISF files are input like any other: wrong-typed fields ---------------------------------

@pytest.mark.parametrize("document, field", [
    ({"metadata": [1]}, "metadata: a list, not an object"),
    ({"metadata": {"dbgext": {"module": 7}}}, "metadata.dbgext.module: an integer, not a string"),
    ({"symbols": {"KeBugCheckEx": {"address": 1.5}}}, "symbols.KeBugCheckEx.address: a float, not an integer"),
    ({"symbols": {"KeBugCheckEx": {"address": [16]}}}, "symbols.KeBugCheckEx.address: a list, not an integer"),
    ({"symbols": {"KeBugCheckEx": {"address": None}}}, "symbols.KeBugCheckEx.address: null, not an integer"),
    ({"symbols": {"KeBugCheckEx": {"address": True}}}, "symbols.KeBugCheckEx.address: a boolean, not an integer"),
    ({"symbols": {"KeBugCheckEx": 16}}, "symbols.KeBugCheckEx: an integer, not an object"),
    ({"symbols": []}, "symbols: a list, not an object"),
    ({"user_types": {"_KTHREAD": {"size": "big", "fields": {}}}}, "user_types._KTHREAD.size: a string, not an integer"),
    ({"user_types": {"_KTHREAD": {"size": 8, "fields": {"StackLimit": {"offset": -8}}}}},
     "user_types._KTHREAD.fields.StackLimit.offset: a negative integer"),
    ({"user_types": {"_KTHREAD": {"size": 8, "fields": {"StackLimit": {"offset": 8, "type": "ptr"}}}}},
     "user_types._KTHREAD.fields.StackLimit.type: a string, not an object"),
    ({"base_types": {"long": {"size": None}}}, "base_types.long.size: null, not an integer"),
])
def test_a_wrong_typed_isf_field_is_named_with_the_file(tmp_path, document, field):
    path = tmp_path / "nt.json"
    path.write_text(json.dumps(document))
    with pytest.raises(BadInput) as caught:
        load_isf_file(str(path))
    assert str(caught.value) == "bad ISF symbol file %s: %s" % (path, field)


def test_a_bad_isf_file_is_reported_once_and_the_run_goes_on_without_it(tmp_path):
    from dbgext.cli import main
    import io
    s = Scenario()
    s.add_module("nt", 0xFFFFF80000000000, 0x10000, image="ntoskrnl.exe")
    s.add_module("mydrv", 0xFFFFF80000100000, 0x1000, image="mydrv.sys")
    s.add_symbol("mydrv", "DriverEntry", 0x10)
    s.build_loaded_module_list()
    dump = str(tmp_path / "k.dmp")
    s.write_kernel_dump(dump)
    symbols = tmp_path / "sym"
    s.write_symbols(str(symbols))
    (symbols / "nt.json").write_text(json.dumps({"metadata": {"dbgext": {"module": ["nt"]}}}))
    out, err = io.StringIO(), io.StringIO()
    code = main(["dps", "mydrv!DriverEntry", "L1", "--dump", dump, "--symbols", str(symbols)], stream=out,
                error_stream=err)
    assert code == 0 and len(out.getvalue().splitlines()) == 1
    assert err.getvalue().splitlines() == ["warning: bad ISF symbol file %s: metadata.dbgext.module: a list, "
                                           "not a string" % (symbols / "nt.json")]


def test_isf_member_types_of_any_shape_display_without_failing(tmp_path):
    path = tmp_path / "nt.json"
    strange = [{"kind": "array", "count": "x", "subtype": [1]}, {"kind": "pointer", "subtype": 5},
               {"kind": "bitfield", "bit_position": None, "type": "int"}, {"kind": ["struct"]},
               {"kind": "base", "name": {"n": 1}}, {"kind": "struct", "name": 3}]
    fields = dict(("f%d" % index, {"offset": index, "type": spec}) for index, spec in enumerate(strange))
    path.write_text(json.dumps({"user_types": {"T": {"size": 8, "fields": fields}}}))
    table = load_isf_file(str(path))
    view = table.type_view("T")
    assert [member.name for member in view.members] == sorted(fields)
    assert table.layout("T")[0] == 8 and table.field_offset("T", "f5") == 5


def _compressed(path, opener, chunks):
    with opener(str(path), "wb") as handle:
        for chunk in chunks:
            handle.write(chunk)


@pytest.mark.parametrize("suffix", [".json.xz", ".json.gz"])
def test_a_compressed_isf_file_is_read_and_named_by_its_stem(tmp_path, suffix):
    import gzip
    import lzma
    path = tmp_path / ("mydrv" + suffix)
    _compressed(path, lzma.open if suffix.endswith("xz") else gzip.open,
                [json.dumps({"symbols": {"DriverEntry": {"address": 16}}}).encode()])
    loaded = load_isf_file(str(path))
    assert (loaded.module_name, loaded.symbols) == ("mydrv", {"DriverEntry": 16})


@pytest.mark.parametrize("suffix", [".json.xz", ".json.gz"])
def test_a_compression_bomb_is_refused_once_it_passes_the_cap_not_expanded_whole(tmp_path, monkeypatch, suffix):
    """Spaces then valid JSON: the stream is read only to the cap (here 1 MiB)."""
    import gzip
    import lzma
    from dbgext.symbols import isf
    monkeypatch.setattr(isf, "MAX_ISF_BYTES", 1 << 20)
    path = tmp_path / ("nt" + suffix)
    _compressed(path, lzma.open if suffix.endswith("xz") else gzip.open,
                [b" " * (1 << 20)] * 16 + [b'{"symbols": {}}'])
    assert path.stat().st_size < 64 << 10
    with pytest.raises(BadInput, match=r"cannot read symbol file .*nt%s: more than 1048576 bytes once "
                                       r"decompressed" % suffix.replace(".", r"\.")):
        load_isf_file(str(path))


def test_json_nested_too_deeply_is_one_line(tmp_path):
    path = tmp_path / "nt.json"
    path.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(BadInput) as caught:
        load_isf_file(str(path))
    assert str(caught.value) == "cannot read symbol file %s: nested too deeply" % path
