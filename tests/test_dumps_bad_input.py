"""Bad dump files give one BadInput naming the file — never a traceback, never a
dead process."""

import io
import os
import struct

import pytest

import dbgext
from dbgext.cli import main
from dbgext.errors import BadInput
from dbgext.layouts.dump_formats import (
    DUMP_HEADER64, MINIDUMP_STREAM, PAGE_SIZE, RDMP_HEADER64, SUMMARY_DUMP64, SUMMARY_DUMP_OLD)
from dbgext.sample.kdump_writer import write_kernel_dump
from minidump_writer import write_minidump

from dumps_support import kernel_scenario, user_scenario


@pytest.fixture(scope="module")
def kernel_dumps(tmp_path_factory):
    directory = tmp_path_factory.mktemp("bad-kernel")
    scenario = kernel_scenario(seed=21, blobs=3)
    full = write_kernel_dump(scenario, str(directory / "full.dmp"))
    bitmap = write_kernel_dump(scenario, str(directory / "bitmap.dmp"), bitmap=True)
    rdmp = write_kernel_dump(scenario, str(directory / "rdmp.dmp"), dump_type=8)
    summary = write_kernel_dump(scenario, str(directory / "summary.dmp"), dump_type=2)
    return dict((name, open(path, "rb").read()) for name, path in (
        ("full", full), ("bitmap", bitmap), ("rdmp", rdmp), ("summary", summary)))


@pytest.fixture(scope="module")
def minidump_bytes(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("bad-minidump") / "good.mdmp")
    write_minidump(user_scenario("x64", seed=22, blobs=2), path)
    return open(path, "rb").read()


def rejected(tmp_path, data, *words):
    """Write ``data`` as a dump, open it, and return the BadInput message, which
    must name the file and contain ``words``."""
    path = str(tmp_path / "bad.dmp")
    with open(path, "wb") as handle:
        handle.write(data)
    with pytest.raises(BadInput) as caught:
        dbgext.open(path)
    message = str(caught.value)
    assert path in message and "\n" not in message
    for word in words:
        assert word in message
    return message


def patched(data, offset, fmt, *values):
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, *values)
    return bytes(out)


# -- kernel dumps -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["full", "bitmap"])
def test_a_kernel_dump_missing_its_last_page_is_truncated(tmp_path, kernel_dumps, kind):
    rejected(tmp_path, kernel_dumps[kind][:-PAGE_SIZE], "truncated")


@pytest.mark.parametrize("kind", ["full", "bitmap"])
def test_a_kernel_dump_cut_inside_the_header_is_truncated(tmp_path, kernel_dumps, kind):
    rejected(tmp_path, kernel_dumps[kind][:0x1000], "truncated")


def test_a_bitmap_dump_cut_inside_its_summary_header_is_truncated(tmp_path, kernel_dumps):
    rejected(tmp_path, kernel_dumps["bitmap"][:SUMMARY_DUMP64["offset"] + 0x20], "truncated", "bitmap header")


def test_a_bitmap_dump_cut_inside_its_bitmap_is_truncated(tmp_path, kernel_dumps):
    cut = SUMMARY_DUMP64["offset"] + SUMMARY_DUMP64["Bitmap"] + 0x10
    rejected(tmp_path, kernel_dumps["bitmap"][:cut], "truncated", "its bitmap")


def test_a_truncated_kernel_dump_is_one_cli_error_line(tmp_path, kernel_dumps):
    path = str(tmp_path / "cut.dmp")
    with open(path, "wb") as handle:
        handle.write(kernel_dumps["full"][:-1])
    stream = io.StringIO()
    assert main(["db", "--dump", path, "0xfffff80000000000"], stream=stream) == 1
    text = stream.getvalue()
    assert text.startswith("error: ") and path in text and len(text.strip().split("\n")) == 1


def test_a_run_table_promising_more_pages_than_the_file_holds_is_truncated(tmp_path, kernel_dumps):
    data = patched(kernel_dumps["full"], DUMP_HEADER64["PhysicalMemoryRuns"] + 8, "<Q", 0x100000)
    rejected(tmp_path, data, "truncated")


def test_an_impossible_run_count_is_a_corrupt_header(tmp_path, kernel_dumps):
    data = patched(kernel_dumps["full"], DUMP_HEADER64["PhysicalMemoryBlock"], "<I", 1000)
    rejected(tmp_path, data, "corrupt", "1000")


def test_a_bitmap_first_page_past_the_end_is_refused(tmp_path, kernel_dumps):
    offset = SUMMARY_DUMP64["offset"] + SUMMARY_DUMP64["FirstPage"]
    rejected(tmp_path, patched(kernel_dumps["bitmap"], offset, "<Q", 1 << 40), "first page")


def test_a_bitmap_longer_than_the_file_is_truncated(tmp_path, kernel_dumps):
    offset = SUMMARY_DUMP64["offset"] + SUMMARY_DUMP64["Pages"]
    rejected(tmp_path, patched(kernel_dumps["bitmap"], offset, "<Q", 1 << 40), "truncated")


def test_required_dump_space_beyond_the_file_is_truncated(tmp_path, kernel_dumps):
    size = len(kernel_dumps["full"])
    data = patched(kernel_dumps["full"], DUMP_HEADER64["RequiredDumpSpace"], "<Q", size + PAGE_SIZE)
    rejected(tmp_path, data, "truncated", str(size + PAGE_SIZE))


def test_a_bitmap_dump_with_a_bad_summary_signature_is_refused(tmp_path, kernel_dumps):
    data = patched(kernel_dumps["bitmap"], SUMMARY_DUMP64["offset"], "<4s", b"XDMP")
    rejected(tmp_path, data, "bitmap")


@pytest.mark.parametrize("kind", ["rdmp", "summary"])
def test_rdmp_and_summary_dumps_missing_their_last_page_are_truncated(tmp_path, kernel_dumps, kind):
    rejected(tmp_path, kernel_dumps[kind][:-PAGE_SIZE], "truncated")


def test_an_rdmp_dump_cut_inside_its_header_is_truncated(tmp_path, kernel_dumps):
    rejected(tmp_path, kernel_dumps["rdmp"][:RDMP_HEADER64["offset"] + 0x10], "truncated", "RDMP")


def test_an_rdmp_dump_with_a_bad_marker_is_refused(tmp_path, kernel_dumps):
    data = patched(kernel_dumps["rdmp"], RDMP_HEADER64["offset"], "<I", 0x41)
    rejected(tmp_path, data, "corrupt RDMP", "marker 0x41")


def test_an_rdmp_first_page_past_the_end_is_refused(tmp_path, kernel_dumps):
    offset = RDMP_HEADER64["offset"] + RDMP_HEADER64["FirstPageOffset"]
    rejected(tmp_path, patched(kernel_dumps["rdmp"], offset, "<Q", 1 << 40), "first page")


def test_an_rdmp_range_promising_more_pages_than_the_file_holds_is_truncated(tmp_path, kernel_dumps):
    offset = RDMP_HEADER64["offset"] + RDMP_HEADER64["Ranges"] + 8
    rejected(tmp_path, patched(kernel_dumps["rdmp"], offset, "<Q", 0x100000), "truncated")


def test_an_impossible_rdmp_range_is_a_corrupt_header(tmp_path, kernel_dumps):
    offset = RDMP_HEADER64["offset"] + RDMP_HEADER64["Ranges"] + 8
    rejected(tmp_path, patched(kernel_dumps["rdmp"], offset, "<Q", 1 << 50), "corrupt", "RDMP range 0")


def test_a_summary_dump_with_a_bad_signature_is_refused(tmp_path, kernel_dumps):
    rejected(tmp_path, patched(kernel_dumps["summary"], SUMMARY_DUMP_OLD["offset"], "<4s", b"XDMP"), "summary")


def test_a_summary_bitmap_longer_than_the_file_is_truncated(tmp_path, kernel_dumps):
    offset = SUMMARY_DUMP_OLD["offset"] + SUMMARY_DUMP_OLD["BitmapSize"]
    rejected(tmp_path, patched(kernel_dumps["summary"], offset, "<I", 0xFFFFFFF0), "truncated")


def test_an_unsupported_dump_type_is_named(tmp_path, kernel_dumps):
    rejected(tmp_path, patched(kernel_dumps["full"], DUMP_HEADER64["DumpType"], "<I", 3), "type 3")


def test_a_64_bit_dump_claiming_to_be_32_bit_is_refused_clearly(tmp_path, kernel_dumps):
    rejected(tmp_path, patched(kernel_dumps["full"], 4, "<4s", b"DUMP"), "unsupported x86 kernel dump type")


# -- any file -----------------------------------------------------------------------------


def test_a_zero_length_file_is_not_a_dump(tmp_path):
    rejected(tmp_path, b"", "not a Windows dump")


def test_a_wrong_signature_is_not_a_dump(tmp_path):
    rejected(tmp_path, b"ZZZZ" + bytes(0x3000), "not a Windows dump")


def test_the_backends_check_their_own_signatures(tmp_path):
    from dbgext.target.kdump import KernelDumpBackend
    from dbgext.target.minidump import MinidumpBackend
    path = str(tmp_path / "zeros.dmp")
    with open(path, "wb") as handle:
        handle.write(bytes(0x3000))
    for backend in (KernelDumpBackend, MinidumpBackend):
        with pytest.raises(BadInput, match="signature"):
            backend(path)


def test_a_missing_file_is_one_error(tmp_path):
    from dbgext.target.kdump import KernelDumpBackend
    with pytest.raises(BadInput, match="cannot open"):
        KernelDumpBackend(str(tmp_path / "missing.dmp"))


# -- minidumps ----------------------------------------------------------------------------


def directory_entry(data, stream_name):
    """File offset of the directory entry of ``stream_name``."""
    count, rva = struct.unpack_from("<II", data, 8)
    for index in range(count):
        if struct.unpack_from("<I", data, rva + 12 * index)[0] == MINIDUMP_STREAM[stream_name]:
            return rva + 12 * index
    raise KeyError(stream_name)


def test_a_minidump_cut_inside_its_memory_is_refused(tmp_path, minidump_bytes):
    rejected(tmp_path, minidump_bytes[:-100], "memory range", "past the end")


def test_a_minidump_cut_inside_its_header_is_truncated(tmp_path):
    rejected(tmp_path, b"MDMP\x93\xa7\x00\x00", "truncated")


def test_a_directory_past_the_end_is_refused(tmp_path, minidump_bytes):
    data = patched(minidump_bytes, 0xC, "<I", len(minidump_bytes) + 8)
    rejected(tmp_path, data, "directory", "past the end")


def test_an_impossible_stream_count_is_a_corrupt_header(tmp_path, minidump_bytes):
    rejected(tmp_path, patched(minidump_bytes, 8, "<I", 0xFFFFFFF0), "corrupt")


def test_a_stream_past_the_end_is_refused(tmp_path, minidump_bytes):
    entry = directory_entry(minidump_bytes, "ModuleList")
    data = patched(minidump_bytes, entry + 8, "<I", len(minidump_bytes) - 4)
    rejected(tmp_path, data, "ModuleList", "past the end")


def test_a_module_name_past_the_end_is_refused(tmp_path, minidump_bytes):
    entry = directory_entry(minidump_bytes, "ModuleList")
    module_list = struct.unpack_from("<I", minidump_bytes, entry + 8)[0]
    data = patched(minidump_bytes, module_list + 4 + 20, "<I", len(minidump_bytes) + 0x100)
    rejected(tmp_path, data, "string", "past the end")


def test_a_list_longer_than_its_stream_is_refused(tmp_path, minidump_bytes):
    entry = directory_entry(minidump_bytes, "ThreadList")
    thread_list = struct.unpack_from("<I", minidump_bytes, entry + 8)[0]
    rejected(tmp_path, patched(minidump_bytes, thread_list, "<I", 5000), "ThreadList", "5000")


def test_a_thread_context_too_small_for_its_architecture_is_refused(tmp_path, minidump_bytes):
    entry = directory_entry(minidump_bytes, "ThreadList")
    thread_list = struct.unpack_from("<I", minidump_bytes, entry + 8)[0]
    rejected(tmp_path, patched(minidump_bytes, thread_list + 4 + 40, "<I", 0x10), "context")


def test_memory64_data_past_the_end_is_refused(tmp_path, minidump_bytes):
    entry = directory_entry(minidump_bytes, "Memory64List")
    memory_list = struct.unpack_from("<I", minidump_bytes, entry + 8)[0]
    data = patched(minidump_bytes, memory_list + 8, "<Q", len(minidump_bytes))
    rejected(tmp_path, data, "memory range", "past the end")


def test_a_minidump_without_system_info_is_refused(tmp_path, minidump_bytes):
    entry = directory_entry(minidump_bytes, "SystemInfo")
    rejected(tmp_path, patched(minidump_bytes, entry, "<I", 0), "SystemInfo")


def test_a_minidump_of_an_unknown_architecture_is_refused_by_number(tmp_path, minidump_bytes):
    entry = directory_entry(minidump_bytes, "SystemInfo")
    system_info = struct.unpack_from("<I", minidump_bytes, entry + 8)[0]
    rejected(tmp_path, patched(minidump_bytes, system_info, "<H", 5), "architecture 5")   # 32-bit ARM


def test_a_truncated_minidump_is_one_cli_error_line(tmp_path, minidump_bytes):
    path = str(tmp_path / "cut.mdmp")
    with open(path, "wb") as handle:
        handle.write(minidump_bytes[:len(minidump_bytes) // 2])
    stream = io.StringIO()
    assert main(["lm", "--dump", path], stream=stream) == 1
    text = stream.getvalue()
    assert text.startswith("error: ") and path in text and len(text.strip().split("\n")) == 1
    assert os.path.exists(path)
