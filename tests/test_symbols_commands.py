"""ln, x, dt and lm over dumps whose modules are real clang/lld-link DLLs, with
their PDBs found along the symbol path and matched by CodeView GUID and age."""

import io
import json
import os
import shutil

import pytest

from symbols_support import DRIVER_BASE, build_dll, kernel_dump_with_driver, minidump_with_dll

from dbgext.cli import main
from dbgext.target import open_dump
from minidump_writer import write_minidump


@pytest.fixture(scope="module")
def x64(tmp_path_factory):
    return build_dll(str(tmp_path_factory.mktemp("cmd-x64")), "x64")


@pytest.fixture(scope="module")
def x86(tmp_path_factory):
    return build_dll(str(tmp_path_factory.mktemp("cmd-x86")), "x86")


@pytest.fixture(scope="module")
def kernel(tmp_path_factory, x64):
    """(dump path, symbol directory holding the PDB)."""
    directory = tmp_path_factory.mktemp("kernel-dump")
    dump = str(directory / "memory.dmp")
    kernel_dump_with_driver(x64, dump)
    symbols = directory / "sym"
    symbols.mkdir()
    shutil.copy(x64.pdb, str(symbols))
    return dump, str(symbols)


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, stream=out, error_stream=err)
    return code, out.getvalue(), err.getvalue()


def rva(built, name):
    from dbgext.symbols.pdb import PdbFile
    pdb = PdbFile(built.pdb)
    try:
        return dict((p.name, p.rva) for p in pdb.procedures())[name]
    finally:
        pdb.close()


def test_ln_names_the_static_function_and_the_next_symbol(kernel, x64):
    dump, symbols = kernel
    code, out, err = run(["ln", "kernel_shapes!CopyLeaf+5", "--dump", dump, "--symbols", symbols])
    leaf = DRIVER_BASE + rva(x64, "CopyLeaf")
    assert code == 0 and err == ""
    assert out.splitlines() == ["(fffff800`%08x)   kernel_shapes!CopyLeaf+0x5   |   (fffff800`%08x)   "
                                "kernel_shapes!ExportedEntry" % (leaf & 0xFFFFFFFF,
                                                                 (DRIVER_BASE + rva(x64, "ExportedEntry"))
                                                                 & 0xFFFFFFFF)]


def test_ln_on_a_symbol_lists_it_as_an_exact_match_in_json(kernel, x64):
    dump, symbols = kernel
    code, out, _ = run(["ln", "kernel_shapes!CopyMiddle", "--json", "--dump", dump, "--symbols", symbols])
    document = json.loads(out)
    assert document["schema_version"] == 1 and document["symbols"] == "pdb symbols"
    assert document["exact"] == ["kernel_shapes!CopyMiddle"]
    assert document["before"][0]["size"] == [p for p in [56, 68] if p][0 if x64.arch == "x64" else 1]


def test_x_matches_wildcards_case_insensitively_with_addresses_and_sizes(kernel, x64):
    dump, symbols = kernel
    code, out, err = run(["x", "KERNEL_SHAPES!copy*", "--dump", dump, "--symbols", symbols])
    lines = out.splitlines()
    assert [line.split()[1] for line in lines] == ["kernel_shapes!CopyMiddle", "kernel_shapes!CopyLeaf"]
    assert lines[1].startswith("fffff800`%08x" % ((DRIVER_BASE + rva(x64, "CopyLeaf")) & 0xFFFFFFFF))
    assert "(size 0x" in lines[1]


def test_x_says_which_modules_had_nothing_to_search(kernel):
    dump, symbols = kernel
    code, out, err = run(["x", "*!*Thread*", "--json", "--dump", dump, "--symbols", symbols])
    document = json.loads(out)
    assert sorted(hit["name"] for hit in document["symbols"]) == ["SampleThread", "ThreadState"]
    assert document["modules_without_symbols"] == ["nt"]


def test_x_warns_once_per_reason_for_modules_it_could_not_search(kernel):
    dump, symbols = kernel
    code, out, err = run(["x", "*!*Thread*", "--dump", dump, "--symbols", symbols])
    assert code == 0 and "kernel_shapes!SampleThread" in out
    assert err.splitlines() == ["warning: nt: no symbols: its image is not in the dump and the symbol path gives no "
                                "PDB for it"]


def test_x_without_a_module_is_a_usage_error(kernel):
    dump, symbols = kernel
    code, _, err = run(["x", "Copy*", "--dump", dump, "--symbols", symbols])
    assert code == 1 and "MODULE!PATTERN" in err


def test_dt_shows_windbg_lines_for_a_kernel_shaped_structure(kernel):
    dump, symbols = kernel
    code, out, _ = run(["dt", "kernel_shapes!_KTHREAD", "--dump", dump, "--symbols", symbols])
    lines = out.splitlines()
    assert lines[0] == "   +0x000 Header            : _DISPATCHER_HEADER"
    assert "   +0x028 InitialStack      : Ptr64 Void" in lines
    assert "   +0x048 Reserved          : Pos 3, 29 Bits" in lines
    assert "   +0x064 Counters          : [4] [2] Uint4B" in lines


def test_dt_with_an_address_shows_values_and_recurses_with_r(kernel):
    dump, symbols = kernel
    code, out, _ = run(["dt", "-r1", "_KTHREAD", "kernel_shapes!SampleThread", "--dump", dump,
                        "--symbols", symbols])
    lines = out.splitlines()
    assert "      +0x008 WaitListHead : _LIST_ENTRY" in lines        # one level: not expanded further
    assert "   +0x04c State             : Initialized (0n0)" in lines
    assert "   +0x048 AutoBoostActive   : 0y0" in lines
    assert "   +0x028 InitialStack      : 0x00000000`00000000 Void" in lines


def test_dt_json_and_type_wildcards(kernel):
    dump, symbols = kernel
    _, out, _ = run(["dt", "kernel_shapes!_LIST_ENTRY", "--json", "--dump", dump, "--symbols", symbols])
    document = json.loads(out)
    assert (document["size"], document["source"]) == (16, "pdb kernel_shapes")
    assert [(m["name"], m["offset"], m["type"]) for m in document["members"]] == [
        ("Flink", 0, "Ptr64 _LIST_ENTRY"), ("Blink", 8, "Ptr64 _LIST_ENTRY")]
    _, out, _ = run(["dt", "kernel_shapes!_KTH*", "--dump", dump, "--symbols", symbols])
    assert "kernel_shapes!_KTHREAD" in out.splitlines() and "kernel_shapes!_KTHREAD_STATE" in out.splitlines()


def test_dt_of_an_unknown_type_says_where_types_come_from(kernel):
    dump, symbols = kernel
    code, _, err = run(["dt", "nt!_EPROCESS", "--dump", dump, "--symbols", symbols])
    assert code != 0 and "_EPROCESS" in err and "kernel_shapes: pdb symbols" in err


def test_lm_shows_each_modules_symbol_status_like_windbg(kernel, x64):
    dump, symbols = kernel
    _, out, _ = run(["lm", "--dump", dump, "--symbols", symbols])
    rows = dict((line.split()[2], line) for line in out.splitlines()[2:])
    assert rows["kernel_shapes"].rstrip().endswith("(pdb symbols)  %s" % os.path.join(symbols, os.path.basename(
        x64.pdb)))
    assert rows["nt"].rstrip().endswith("(no symbols)")
    _, out, _ = run(["lm", "--dump", dump, "--symbols", "", "--json"])
    modules = dict((m["name"], m) for m in json.loads(out)["modules"])
    assert modules["kernel_shapes"]["symbols"] == "export symbols"
    assert modules["kernel_shapes"]["symbol_file"] is None


def test_a_mismatched_pdb_is_refused_once_and_exports_name_what_they_can(kernel, x64, tmp_path):
    from test_symbols_path import mismatched_copy
    dump, _ = kernel
    mismatched_copy(x64, tmp_path)
    code, out, err = run(["ln", "kernel_shapes!ExportedEntry", "--dump", dump, "--symbols", str(tmp_path)])
    assert code == 0 and "kernel_shapes!ExportedEntry" in out
    assert err.count("mismatched PDB") == 1


def test_symbolize_names_non_exported_functions_only_with_the_pdb(kernel, x64):
    """The closing note's count: functions named with and without the PDB."""
    dump, symbols = kernel
    from dbgext.symbols.pdb import PdbFile
    pdb = PdbFile(x64.pdb)
    procedures = pdb.procedures()
    pdb.close()
    named = {}
    for label, path in (("pdb", [symbols]), ("exports", [])):
        target = open_dump(dump, symbols=path)
        named[label] = sum(1 for p in procedures
                           if target.symbolize(DRIVER_BASE + p.rva) == "kernel_shapes!" + p.name)
        target.close()
    exported = [p for p in procedures if p.rva in x64.image.exports]
    assert named == {"pdb": len(procedures), "exports": len(exported)}
    assert len(exported) < len(procedures)


def test_dps_on_ps_loaded_module_list_works_without_any_symbols(kernel):
    dump, _ = kernel
    code, out, err = run(["dps", "nt!PsLoadedModuleList", "L2", "--dump", dump, "--symbols", ""])
    assert code == 0 and err == "" and len(out.splitlines()) == 2


def test_an_x86_minidump_module_gets_its_pdb_names_undecorated(tmp_path, x86):
    dump = str(tmp_path / "user.dmp")
    _, base = minidump_with_dll(x86, dump)
    shutil.copy(x86.pdb, str(tmp_path))
    target = open_dump(dump, symbols=[str(tmp_path)])
    assert target.symbols.status("kernel_shapes") == "pdb symbols"
    assert target.symbolize(base + rva(x86, "CopyLeaf") + 3) == "kernel_shapes!CopyLeaf+0x3"
    assert target.symbol_address("kernel_shapes!GlobalCounter") is not None   # _GlobalCounter in publics
    assert target.symbols.type_layout("_KTHREAD").fields["InitialStack"] == (32, "P")
    target.close()


def test_pdb_types_feed_the_layout_lookup_and_say_so(kernel):
    from dbgext.layouts import lookup_layout
    dump, symbols = kernel
    target = open_dump(dump, symbols=[symbols])
    layout = lookup_layout(target, "kernel_shapes!_KTHREAD", fields=["InitialStack", "StackLimit", "StackBase"])
    assert (layout.offset("StackLimit"), layout.source) == (0x30, "pdb kernel_shapes")
    assert target.symbols.type_layout("_KTHREAD").fields["Counters"] == (0x64, "8I")
    target.close()


def test_a_pe_on_disk_gets_its_pdb_symbols_for_stackuse(x64, tmp_path):
    from dbgext.pe import PEImage
    from dbgext.symbols.table import pe_file_symbols
    shutil.copy(x64.pdb, str(tmp_path))
    symbols = pe_file_symbols(PEImage.from_file(x64.dll), [str(tmp_path)])
    assert symbols.status == "pdb symbols" and symbols.symbols["CopyLeaf"] == rva(x64, "CopyLeaf")
    assert pe_file_symbols(PEImage.from_file(x64.dll), [str(tmp_path / "empty")]) is None


def test_a_codeview_record_missing_from_the_dump_comes_from_the_image_in_the_store(x64, tmp_path):
    from dbgext.pe import DIRECTORY_DEBUG
    from dbgext.sample.scenario import Scenario
    from symbols_support import mapped_image
    scenario = Scenario("x64", "kernel")
    data = mapped_image(x64.dll)
    scenario.add_module("kernel_shapes", DRIVER_BASE, len(data), image="kernel_shapes.sys", content=data)
    scenario.build_loaded_module_list()
    debug_rva = x64.image.directory(DIRECTORY_DEBUG)[0]
    scenario.excluded_pages.add((DRIVER_BASE + debug_rva) & ~0xFFF)   # the debug directory is not in the dump
    dump = str(tmp_path / "memory.dmp")
    scenario.write_kernel_dump(dump)
    store = tmp_path / "store"
    key = "%08X%x" % (x64.image.timestamp, x64.image.size_of_image)
    (store / "kernel_shapes.sys" / key).mkdir(parents=True)
    shutil.copy(x64.dll, str(store / "kernel_shapes.sys" / key / "kernel_shapes.sys"))
    shutil.copy(x64.pdb, str(store))
    without_image = open_dump(dump, symbols=[str(tmp_path / "nothing")])
    assert without_image.symbols.status("kernel_shapes") != "pdb symbols"
    without_image.close()
    target = open_dump(dump, symbols=["%s;srv*%s" % (store, store)])
    assert target.symbols.status("kernel_shapes") == "pdb symbols"
    assert target.symbolize(DRIVER_BASE + rva(x64, "CopyLeaf")) == "kernel_shapes!CopyLeaf"
    target.close()


def test_dt_of_an_enum_lists_its_enumerators(kernel):
    dump, symbols = kernel
    _, out, _ = run(["dt", "kernel_shapes!_KTHREAD_STATE", "--dump", dump, "--symbols", symbols])
    assert out.splitlines() == ["   Initialized = 0n0", "   Ready = 0n1", "   Running = 0n2", "   Waiting = 0n5"]


def test_dt_of_a_global_variable_shows_its_type_at_its_address(kernel, x64):
    dump, symbols = kernel
    _, by_variable, _ = run(["dt", "kernel_shapes!SampleThread", "--json", "--dump", dump, "--symbols", symbols])
    _, by_type, _ = run(["dt", "kernel_shapes!_KTHREAD", "kernel_shapes!SampleThread", "--json", "--dump", dump,
                         "--symbols", symbols])
    assert json.loads(by_variable)["members"] == json.loads(by_type)["members"]
    assert json.loads(by_variable)["address"] == json.loads(by_type)["address"]
    assert json.loads(by_variable)["address"] is not None


def test_bare_names_search_every_module_unless_that_could_download(kernel, x64, tmp_path):
    dump, symbols = kernel
    local = open_dump(dump, symbols=[symbols])
    assert local.symbol_address("CopyLeaf") == DRIVER_BASE + rva(x64, "CopyLeaf")
    local.close()
    # A symbol server that is down: a bare name must not try every module's PDB.
    remote = open_dump(dump, symbols=["%s;srv*%s*http://127.0.0.1:9/sym" % (symbols, tmp_path)])
    assert remote.symbol_address("CopyLeaf") is None and list(remote.symbols.problems) == []
    assert remote.symbol_address("kernel_shapes!CopyLeaf") == DRIVER_BASE + rva(x64, "CopyLeaf")
    assert remote.symbol_address("CopyLeaf") == DRIVER_BASE + rva(x64, "CopyLeaf")   # now known
    remote.close()


def test_a_module_whose_headers_the_dump_lost_gets_its_pdb_through_the_stores_image(tmp_path, x64):
    """Minidumps and small dumps often lack a module's header page: the loader's
    TimeDateStamp and SizeOfImage name the image in the store, and its CodeView
    record names the PDB, as WinDbg finds them."""
    from dbgext.sample.scenario import Scenario
    from symbols_support import mapped_image
    image = x64.image
    data = mapped_image(x64.dll)
    scenario = Scenario("x64", "user")
    base = 0x7FF800000000
    scenario.add_module("kernel_shapes", base, len(data), image="kernel_shapes.dll", content=data,
                        timestamp=image.timestamp)
    scenario.unmap(base, 0x1000)
    dump = str(tmp_path / "headerless.mdmp")
    write_minidump(scenario, dump)
    store = tmp_path / "store"
    for name, source, key in (("kernel_shapes.dll", x64.dll, "%08X%x" % (image.timestamp, image.size_of_image)),
                              (os.path.basename(x64.pdb), x64.pdb, image.codeview.symbol_server_key)):
        (store / name / key).mkdir(parents=True)
        shutil.copy(source, str(store / name / key / name))
    leaf = base + rva(x64, "CopyLeaf")
    code, out, err = run(["ln", "%x" % (leaf + 2), "--dump", dump, "--symbols", "srv*%s" % store])
    assert code == 0, err
    assert "kernel_shapes!CopyLeaf+0x2" in out
    code, out, _ = run(["ln", "%x" % (leaf + 2), "--dump", dump, "--symbols", str(tmp_path / "empty")])
    assert "CopyLeaf" not in out


def test_export_names_cost_the_header_page_and_the_export_table_only(kernel, x64, tmp_path):
    """Inside WinDbg a whole module read over the debugger connection takes
    minutes: naming by exports reads the export directory, not the image."""
    dump, _ = kernel
    from dbgext.pe import DIRECTORY_EXPORT, PEImage
    image = PEImage.from_file(x64.dll)
    rva, size = image.directory(DIRECTORY_EXPORT)
    export_pages = set(range((rva >> 12), ((rva + size - 1) >> 12) + 1))
    with open_dump(dump, symbols=[str(tmp_path)]) as target:
        target.drop_cache()
        target.stats.reset()
        assert target.symbols.status("kernel_shapes") == "export symbols"
        assert target.symbol_address("kernel_shapes!ExportedEntry") == DRIVER_BASE + rva_of_export(image)
        assert target.stats.backend_pages <= 1 + len(export_pages) + 1   # + the header page, + one run boundary
        assert target.stats.backend_pages < image.size_of_image >> 12


def rva_of_export(image):
    return dict((name, rva) for rva, name in image.exports.items())["ExportedEntry"]
