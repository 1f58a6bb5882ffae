"""PDB fixtures from an independent toolchain, built at test time and cached per
session: tests/data/symbols/kernel_shapes.c compiled by clang for the MSVC target
with CodeView debug info and linked by lld-link with /debug /pdb, for x64 and x86.
Tests that need them skip (with the reason) when clang or lld-link is missing."""

import os
import subprocess

from dbgext.pe import PEImage
from dbgext.symbols.pdb import PdbFile
from dbgext.symbols.types import pdb_type_text, pdb_type_view
from minidump_writer import write_minidump
from requirements import need_tool

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "data", "symbols", "kernel_shapes.c")
TRIPLES = {"x64": "x86_64-pc-windows-msvc", "x86": "i686-pc-windows-msvc"}
TOOLS = ("clang", "lld-link")


class BuiltDll(object):
    def __init__(self, arch, dll, pdb):
        self.arch = arch
        self.dll = dll
        self.pdb = pdb
        self.image = PEImage.from_file(dll)


def build_dll(directory, arch, source=SOURCE, name="kernel_shapes", extra_link=()):
    """Compile and link ``source`` into ``directory``; a BuiltDll."""
    need_tool(*TOOLS)
    obj = os.path.join(directory, "%s_%s.obj" % (name, arch))
    dll = os.path.join(directory, "%s_%s.dll" % (name, arch))
    pdb = os.path.join(directory, "%s_%s.pdb" % (name, arch))
    subprocess.run(["clang", "--target=" + TRIPLES[arch], "-g", "-gcodeview", "-O1", "-c", source, "-o", obj],
                   check=True, capture_output=True)
    subprocess.run(["lld-link", "/dll", "/debug", "/noentry", "/nodefaultlib", "/machine:" + arch,
                    "/pdb:" + pdb, "/out:" + dll, obj] + list(extra_link), check=True, capture_output=True)
    return BuiltDll(arch, dll, pdb)


def mapped_image(path):
    """The bytes of a PE file laid out as the loader maps it (sections at their RVAs)."""
    image = PEImage.from_file(path)
    raw = open(path, "rb").read()
    mapped = bytearray(image.size_of_image)
    headers = min(len(raw), image.sections[0].raw_offset if image.sections else len(raw))
    mapped[:headers] = raw[:headers]
    for section in image.sections:
        data = raw[section.raw_offset:section.raw_offset + min(section.raw_size, section.size)]
        mapped[section.rva:section.rva + len(data)] = data
    return bytes(mapped)


def llvm_pdbutil(*args):
    need_tool("llvm-pdbutil")
    return subprocess.run(["llvm-pdbutil"] + list(args), check=True, capture_output=True, text=True).stdout


DRIVER_BASE = 0xFFFFF80001000000
DLL_BASE_X86 = 0x10000000


def kernel_dump_with_driver(built, path, name="kernel_shapes"):
    """An x64 kernel dump (written by dbgext's writer) with ``built``'s DLL loaded
    as ``<name>.sys`` and an nt module; the DLL's PDB is not beside it."""
    from dbgext.sample.scenario import Scenario
    scenario = Scenario("x64", "kernel")
    data = mapped_image(built.dll)
    scenario.add_module("nt", 0xFFFFF80000000000, 0x10000, image="ntoskrnl.exe")
    scenario.add_module(name, DRIVER_BASE, len(data), image=name + ".sys", content=data)
    scenario.build_loaded_module_list()
    scenario.registers = {"rip": DRIVER_BASE + 0x1000, "rsp": 0}
    scenario.write_kernel_dump(path)
    return scenario


def minidump_with_dll(built, path, name="kernel_shapes"):
    """A user-mode minidump (x86 or x64 after ``built``) with the DLL loaded."""
    from dbgext.sample.scenario import Scenario
    scenario = Scenario(built.arch, "user")
    data = mapped_image(built.dll)
    base = DLL_BASE_X86 if built.arch == "x86" else 0x7FF800000000
    scenario.add_module(name, base, len(data), image=name + ".dll", content=data)
    write_minidump(scenario, path)
    return scenario, base


def read_everything(path):
    """What dbgext ever asks of a PDB."""
    pdb = PdbFile(path)
    try:
        pdb.matches(pdb.guid, pdb.age)
        pdb.publics()
        pdb.procedures()
        pdb.data()
        types = pdb.types
        for name in types.names():
            record = types.find(name)
            view = pdb_type_view(types, record)
            for member in view.members:
                pdb_type_text(types, types.strip(member.nested).index if member.nested else 0x74)
    finally:
        pdb.close()
