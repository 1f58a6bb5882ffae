"""dbgext.open: the backend follows the file's signature, ISF symbols are found
beside the dump, and the dump is usable with or without them."""

import io
import json
import os
import shutil
import struct

import pytest

import dbgext
from dbgext.cli import main
from dbgext.target.base import PAGE_SIZE
from dbgext.target.kdump import KernelDumpBackend
from dbgext.target.minidump import MinidumpBackend

from dumps_support import NT_BASE, kernel_scenario, user_scenario
from minidump_writer import write_minidump


@pytest.fixture(scope="module")
def kernel_dump(tmp_path_factory):
    scenario = kernel_scenario(seed=31, blobs=2)
    path = str(tmp_path_factory.mktemp("open") / "kernel.dmp")
    scenario.write_kernel_dump(path)
    return scenario, path


def test_a_page_signature_opens_the_kernel_dump_backend(kernel_dump):
    _, path = kernel_dump
    assert isinstance(dbgext.open(path).backend, KernelDumpBackend)


def test_an_mdmp_signature_opens_the_minidump_backend(tmp_path):
    path = str(tmp_path / "user.mdmp")
    write_minidump(user_scenario("x86", seed=32, blobs=1), path)
    target = dbgext.open(path)
    assert isinstance(target.backend, MinidumpBackend)
    assert target.arch == "x86" and target.pointer_size == 4


def test_the_file_extension_does_not_matter(kernel_dump, tmp_path):
    _, path = kernel_dump
    renamed = str(tmp_path / "crash.mdmp")
    shutil.copyfile(path, renamed)
    assert isinstance(dbgext.open(renamed).backend, KernelDumpBackend)


def test_symbols_in_a_dot_symbols_directory_beside_the_dump_are_found(kernel_dump, tmp_path):
    scenario, path = kernel_dump
    dump = str(tmp_path / "k.dmp")
    shutil.copyfile(path, dump)
    scenario.write_symbols(dump + ".symbols")
    target = dbgext.open(dump)
    assert target.symbol_address("nt!KeBugCheckEx") == NT_BASE + 0x1230
    assert target.symbolize(NT_BASE + 0x1234) == "nt!KeBugCheckEx+0x4"
    assert target.symbol_address("nt!PsLoadedModuleList") == scenario.ps_loaded_module_list


def test_symbols_in_a_symbols_directory_next_to_the_dump_are_found(kernel_dump, tmp_path):
    scenario, path = kernel_dump
    dump = str(tmp_path / "k.dmp")
    shutil.copyfile(path, dump)
    scenario.write_symbols(str(tmp_path / "symbols"))
    assert dbgext.open(dump).symbol_address("nt!KeBugCheckEx") == NT_BASE + 0x1230


def test_explicit_symbol_paths_win(kernel_dump, tmp_path):
    scenario, path = kernel_dump
    scenario.write_symbols(str(tmp_path / "elsewhere"))
    target = dbgext.open(path, symbols=[str(tmp_path / "elsewhere")])
    assert target.symbol_address("nt!KeBugCheckEx") == NT_BASE + 0x1230


def test_without_symbols_addresses_are_described_by_module(kernel_dump):
    _, path = kernel_dump
    target = dbgext.open(path)
    assert target.symbol_address("nt!KeBugCheckEx") is None
    assert target.symbolize(NT_BASE + 0x1234) == "nt+0x1234"


def test_closing_the_target_releases_the_file(kernel_dump):
    _, path = kernel_dump
    target = dbgext.open(path)
    target.close()
    target.close()  # twice is harmless
    assert target.backend.file.closed


def test_the_cli_dumps_bytes_from_a_kernel_dump_with_symbols_beside_it(kernel_dump, tmp_path):
    scenario, path = kernel_dump
    dump = str(tmp_path / "k.dmp")
    shutil.copyfile(path, dump)
    scenario.write_symbols(dump + ".symbols")
    stream = io.StringIO()
    assert main(["db", "--dump", dump, "nt!KeBugCheckEx", "L10"], stream=stream) == 0
    first_bytes = " ".join("%02x" % b for b in scenario.read(NT_BASE + 0x1230, 4))
    assert stream.getvalue().startswith("fffff800`00001230  " + first_bytes)


def test_the_cli_lists_minidump_modules_as_json(tmp_path):
    path = str(tmp_path / "user.mdmp")
    write_minidump(user_scenario("x64", seed=33, blobs=1), path)
    stream = io.StringIO()
    assert main(["lm", "--dump", path, "--json"], stream=stream) == 0
    document = json.loads(stream.getvalue())
    assert "ntdll" in json.dumps(document) and os.path.exists(path)


def test_without_a_page_cache_every_read_goes_to_the_backend(kernel_dump):
    scenario, path = kernel_dump
    backend = dbgext.open(path).backend
    target = dbgext.Target(backend, cache_pages=0)
    address = min(va for va in scenario.pages if va >> 47)
    for _ in range(3):
        assert target.u64(address) == struct.unpack("<Q", scenario.read(address, 8))[0]
    assert target.stats.backend_calls == 3 and target.stats.cache_hits == 0


def test_with_the_page_cache_one_backend_call_serves_a_page(kernel_dump):
    scenario, path = kernel_dump
    target = dbgext.open(path)
    address = min(va for va in scenario.pages if va >> 47)
    for offset in range(0, PAGE_SIZE, 8):
        assert target.read(address + offset, 8) == scenario.read(address + offset, 8)
    assert target.stats.backend_calls == 1 and target.stats.reads == PAGE_SIZE // 8
