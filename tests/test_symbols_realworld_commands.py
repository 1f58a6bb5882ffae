"""One ``--symbols`` for every command, over the real KMDF driver and DLLs that
Microsoft's linker wrote (../shared/realworld/pdb): a plain folder, a symbol store,
a symbol server, ``_NT_SYMBOL_PATH`` and a file all give the same PDB symbols,
matched by GUID and age, with names compared without regard to case.  And every
procedure keeps its own address: C++ overloads (XRay's four
``std::basic_ostream<wchar_t,...>::operator<<``) each have one."""

import io
import json
import os
import shutil

import pytest

from symbols_support import REALWORLD_PDB, kernel_dump_with_driver, minidump_with_dll

from dbgext.cli import main
from dbgext.pe import PEImage
from dbgext.symbols.pdb import PdbFile

DRIVER_X64 = os.path.join(REALWORLD_PDB, "msvc2013-x64-kmdf-driver")
DRIVER_NAME = "Native_x64_VS2013_KernelModeDriver"
KERNEL_BASE = 0xFFFFF80001000000


class RealImage(object):
    """What the dump writers need of an image: its arch and file."""

    def __init__(self, folder, file_name):
        self.dll = os.path.join(REALWORLD_PDB, folder, file_name)
        self.image = PEImage.from_file(self.dll)
        self.arch = self.image.arch


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, stream=out, error_stream=err)
    return code, out.getvalue(), err.getvalue()


def procedures(path):
    pdb = PdbFile(path)
    try:
        return pdb.procedures()
    finally:
        pdb.close()


@pytest.fixture(scope="module")
def driver_dump(tmp_path_factory):
    directory = tmp_path_factory.mktemp("real-driver")
    dump = str(directory / "memory.dmp")
    kernel_dump_with_driver(RealImage("msvc2013-x64-kmdf-driver", DRIVER_NAME + ".sys"), dump, DRIVER_NAME)
    return dump


def symbol_paths(tmp_path):
    """Each kind of symbol path, naming the driver's PDB with its case changed."""
    pdb = os.path.join(DRIVER_X64, DRIVER_NAME + ".pdb")
    codeview = PEImage.from_file(os.path.join(DRIVER_X64, DRIVER_NAME + ".sys")).codeview
    plain = tmp_path / "plain"
    plain.mkdir()
    shutil.copy(pdb, str(plain / (DRIVER_NAME.lower() + ".pdb")))
    store = tmp_path / "store"
    in_store = store / (DRIVER_NAME.upper() + ".PDB") / codeview.symbol_server_key.lower()
    in_store.mkdir(parents=True)
    shutil.copy(pdb, str(in_store / (DRIVER_NAME + ".pdb")))
    return {"folder": str(plain), "store": "srv*%s" % store, "file": pdb, "realworld folder": DRIVER_X64}


@pytest.mark.parametrize("kind", ["folder", "store", "file", "realworld folder", "_NT_SYMBOL_PATH"])
def test_every_command_gets_the_drivers_pdb_symbols_from_each_kind_of_symbol_path(
        driver_dump, tmp_path, monkeypatch, kind):
    paths = symbol_paths(tmp_path)
    if kind == "_NT_SYMBOL_PATH":
        monkeypatch.setenv("_NT_SYMBOL_PATH", paths["store"])
        option = []
    else:
        monkeypatch.delenv("_NT_SYMBOL_PATH", raising=False)
        option = ["--symbols", paths[kind]]
    dump = ["--dump", driver_dump] + option
    entry = [p for p in procedures(os.path.join(DRIVER_X64, DRIVER_NAME + ".pdb")) if p.name == "DriverEntry"][0]

    code, out, err = run(["lm", "--json"] + dump)
    modules = dict((module["name"], module) for module in json.loads(out)["modules"])
    assert code == 0 and modules[DRIVER_NAME]["symbols"] == "pdb symbols", (out, err)

    code, out, err = run(["ln", "%s!DriverEntry+5" % DRIVER_NAME] + dump)
    assert code == 0 and "%s!DriverEntry+0x5" % DRIVER_NAME in out, (out, err)

    code, out, err = run(["x", "%s!Driver*" % DRIVER_NAME, "--json"] + dump)
    hits = json.loads(out)["symbols"]
    assert code == 0 and {"name": "DriverEntry", "address": KERNEL_BASE + entry.rva, "size": entry.size,
                          "module": DRIVER_NAME} in hits

    code, out, err = run(["dt", "%s!_WDF_OBJECT_ATTRIBUTES" % DRIVER_NAME] + dump)
    assert code == 0 and "+0x000 Size" in out and "ExecutionLevel" in out, (out, err)

    code, out, err = run(["stackuse", "functions", "--module", DRIVER_NAME, "--jsonl"] + dump)
    named = [json.loads(line)["name"] for line in out.splitlines()]
    assert code == 0 and "DriverEntry" in named, err


@pytest.mark.parametrize("entry, image", [
    ("msvc2013-x64-kmdf-driver", DRIVER_NAME + ".sys"),
    ("msvc2013-x86-kmdf-driver", "Native_x86_VS2013_KernelModeDriver.sys"),
    ("msvc2015-x64-dll", "Native_x64_VS2015_Default.dll"),
    ("msvc2022-x64-xframe-eh-dll", "xframe_eh_dll.dll"),
    ("msvc2019-x64-debug-full", "Native_x64_VS2019_CPlusPlus_DEBUG_FULL.dll"),
])
def test_stackuse_pe_names_every_procedure_through_symbols_as_with_pdb(tmp_path, monkeypatch, entry, image):
    monkeypatch.delenv("_NT_SYMBOL_PATH", raising=False)
    folder = os.path.join(REALWORLD_PDB, entry)
    pe = os.path.join(folder, image)
    pdb = [name for name in os.listdir(folder) if name.endswith(".pdb")][0]
    code_names = {}
    image = PEImage.from_file(pe)
    for procedure in procedures(os.path.join(folder, pdb)):
        if image.is_code(procedure.rva):
            code_names.setdefault(procedure.rva, set()).add(procedure.name)
    for option in (["--symbols", folder], ["--pdb", os.path.join(folder, pdb)]):
        code, out, err = run(["stackuse", "functions", "--pe", pe, "--jsonl"] + option)
        assert code == 0 and err == "", err
        named = dict((row["rva"], row["name"]) for row in map(json.loads, out.splitlines()))
        # Folded procedures share an address: the function has one of their names.
        assert all(named.get(rva) in names for rva, names in code_names.items()), option


@pytest.fixture(scope="module")
def xray(tmp_path_factory):
    directory = tmp_path_factory.mktemp("xray")
    dump = str(directory / "xray.dmp")
    _, base = minidump_with_dll(RealImage("msvc2008-x64-xray", "XRay.exe"), dump, "XRay")
    return dump, base


OSTREAM_INSERT = "std::basic_ostream<wchar_t,std::char_traits<wchar_t> >::operator<<"


def test_x_lists_each_overload_at_its_own_address(xray):
    dump, base = xray
    code, out, err = run(["x", "XRay!*operator<<", "--json", "--dump", dump,
                          "--symbols", os.path.join(REALWORLD_PDB, "msvc2008-x64-xray")])
    hits = [hit for hit in json.loads(out)["symbols"] if hit["name"] == OSTREAM_INSERT]
    expected = sorted(base + p.rva for p in procedures(os.path.join(REALWORLD_PDB, "msvc2008-x64-xray", "XRay.pdb"))
                      if p.name == OSTREAM_INSERT)
    assert code == 0 and len(expected) == 4 and sorted(hit["address"] for hit in hits) == expected


def test_ln_names_the_overload_containing_an_address_undecorated_with_its_offset(xray):
    dump, base = xray
    overloads = sorted(p for p in procedures(os.path.join(REALWORLD_PDB, "msvc2008-x64-xray", "XRay.pdb"))
                       if p.name == OSTREAM_INSERT)
    symbols = ["--dump", dump, "--symbols", os.path.join(REALWORLD_PDB, "msvc2008-x64-xray")]
    for overload in overloads:
        code, out, err = run(["ln", "%x" % (base + overload.rva + 1), "--json"] + symbols)
        before = json.loads(out)["before"]
        assert code == 0 and before[0]["name"] == OSTREAM_INSERT
        assert before[0]["address"] == base + overload.rva and before[0]["displacement"] == 1
        assert not any(hit["name"].startswith("?") for hit in before)


def test_an_arm64_image_gets_its_pdb_symbols():
    from dbgext.symbols.table import pe_file_symbols
    folder = os.path.join(REALWORLD_PDB, "msvc2022-arm64-xcpt4")
    image = PEImage.from_file(os.path.join(folder, "xcpt4.exe"))
    assert (image.machine, image.arch, image.pointer_size) == (0xAA64, "arm64", 8)
    table = pe_file_symbols(image, [folder])
    assert table is not None and table.status == "pdb symbols"
    names = table.names_by_rva()
    assert any(name == "main" for name in names.values())
