"""dbgext.pe, the one PE reader, against images made by independent tools (MinGW-w64
gcc, clang + lld-link) and cross-checked with llvm-readobj; plus hostile headers."""

import re
import subprocess
from pathlib import Path

import pytest

from dbgext.errors import BadInput
from dbgext.pe import PEImage, undecorate
from dbgext.stackuse.fixtures import Function, build_pe
from requirements import need_tool

TOOLS = ["i686-w64-mingw32-gcc", "clang", "lld-link", "llvm-readobj"]
# MSVC 14.31's ARM64 xcpt4.exe (not copied: read from ../shared/realworld).
XCPT4 = Path(__file__).resolve().parents[1].parent / "shared" / "realworld" / "pdb" / "msvc2022-arm64-xcpt4" / \
    "xcpt4.exe"
# Its DIR64 relocation sites, as `llvm-readobj --coff-basereloc` lists them (17
# DIR64 entries and one ABSOLUTE padding entry).
XCPT4_DIR64_SITES = [0x8190, 0x8198, 0x81A8, 0x81B8, 0x81D0, 0x81D8, 0x8210, 0x8218, 0x8220, 0x8228,
                     0x89C8, 0x89E0, 0x89E8, 0x8AA0, 0x8AA8, 0xB020, 0xB038]

SOURCE = r"""
#ifdef _MSC_VER  /* MinGW's runtime brings its own */
typedef struct { unsigned Size, TimeDateStamp; unsigned short Major, Minor; unsigned Fields[10];
                 unsigned short CSDVersion, DependentLoadFlags; unsigned EditList, SecurityCookie,
                 SEHandlerTable, SEHandlerCount, GuardCFCheck, GuardCFDispatch, GuardCFFunctionTable,
                 GuardCFFunctionCount, GuardFlags; } LOAD_CONFIG;
extern void *__safe_se_handler_table[]; extern unsigned char __safe_se_handler_count;
extern void *__guard_fids_table[]; extern unsigned char __guard_fids_count, __guard_flags;
const LOAD_CONFIG _load_config_used = {
    sizeof(LOAD_CONFIG), 0, 0, 0, {0}, 0, 0, 0, 0, (unsigned)__safe_se_handler_table,
    (unsigned)&__safe_se_handler_count, 0, 0, (unsigned)__guard_fids_table,
    (unsigned)&__guard_fids_count, (unsigned)&__guard_flags };
void *__guard_check_icall_fptr;
#endif
int handler(void *a, void *b, void *c, void *d) { return 1; }
static int callback(int x) { return x + 1; }
int (*callbacks[1])(int) = { callback };
__declspec(dllexport) int __stdcall exported(int x) { return callbacks[0](x); }
"""
SAFESEH = ".def @feat.00; .scl 3; .type 0; .endef\n.globl @feat.00\n.set @feat.00, 1\n.safeseh _handler\n"


def _readobj(path, option):
    return subprocess.run(["llvm-readobj", option, path], stdout=subprocess.PIPE, check=True,
                          universal_newlines=True).stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    need_tool(*TOOLS)
    directory = tmp_path_factory.mktemp("pe")
    (directory / "lib.c").write_text(SOURCE)
    (directory / "seh.s").write_text(SAFESEH)
    run = lambda *argv: subprocess.run(argv, cwd=str(directory), check=True)  # noqa: E731
    run("i686-w64-mingw32-gcc", "-O1", "-shared", "-o", "mingw.dll", "lib.c")
    run("clang", "--target=i686-pc-windows-msvc", "-O1", "-Xclang", "-cfguard", "-c", "lib.c", "-o", "lib.obj")
    run("clang", "--target=i686-pc-windows-msvc", "-c", "seh.s", "-o", "seh.obj")
    run("lld-link", "/dll", "/noentry", "/nodefaultlib", "/safeseh", "/guard:cf", "/debug", "/out:clang.dll",
        "lib.obj", "seh.obj")
    return {"mingw": str(directory / "mingw.dll"), "clang": str(directory / "clang.dll")}


def test_headers_match_llvm_readobj(built):
    for path in built.values():
        image = PEImage.from_file(path)
        text = _readobj(path, "--file-headers")
        assert image.arch == "x86"
        assert "ImageBase: 0x%X" % image.image_base in text
        assert "SizeOfImage: %d" % image.size_of_image in text
        assert "TimeDateStamp: " in text and "(0x%X)" % image.timestamp in text
        assert "AddressOfEntryPoint: 0x%X" % image.entry_point in text


def test_exports_are_code_rvas_with_their_names(built):
    image = PEImage.from_file(built["clang"])
    text = _readobj(built["clang"], "--coff-exports")
    rva = int(re.search(r"Name: _?exported@4\s+RVA: (0x[0-9A-F]+)", text).group(1), 16)
    assert image.exports == {rva: "_exported@4"}


def test_coff_symbol_table_names_every_mingw_function_undecorated(built):
    image = PEImage.from_file(built["mingw"])
    names = set(image.coff_functions.values())
    assert {"handler", "callback", "exported"} <= names
    assert image.coff_functions[min(image.exports)] == "exported"  # exported@4 -> exported
    for rva in image.coff_functions:
        assert image.is_code(rva)


def test_clang_msvc_image_has_no_coff_symbols(built):
    assert PEImage.from_file(built["clang"]).coff_functions == {}


def test_base_relocations_match_llvm_readobj(built):
    for path in built.values():
        text = _readobj(path, "--coff-basereloc")
        expected = sorted(int(address, 16) for address in re.findall(r"Type: HIGHLOW\s+Address: (0x[0-9A-F]+)", text))
        assert PEImage.from_file(path).relocations == expected


def xcpt4():
    if not XCPT4.is_file():
        pytest.fail("%s is missing: the real-world files live in ../shared/realworld" % XCPT4)
    return str(XCPT4)


def test_an_arm64_images_relocations_are_its_17_dir64_sites():
    image = PEImage.from_file(xcpt4())
    assert (image.arch, image.relocations) == ("arm64", XCPT4_DIR64_SITES)


def test_the_arm64_dir64_sites_are_llvm_readobjs():
    need_tool("llvm-readobj")
    text = _readobj(xcpt4(), "--coff-basereloc")
    assert sorted(int(address, 16) for address in re.findall(r"Type: DIR64\s+Address: (0x[0-9A-F]+)", text)) == \
        XCPT4_DIR64_SITES


def test_codeview_record_names_the_pdb_by_guid_and_age(built):
    image = PEImage.from_file(built["clang"])
    text = _readobj(built["clang"], "--coff-debug-directory")
    stored = bytes(int(byte, 16) for byte in re.search(r"PDBGUID: \(([0-9A-F ]+)\)", text).group(1).split())
    assert image.codeview.guid == stored
    assert image.codeview.age == int(re.search(r"PDBAge: (\d+)", text).group(1))
    assert image.codeview.pdb_name.endswith("clang.pdb")
    assert image.codeview.symbol_server_key == image.codeview.guid_text.replace("-", "") + "%X" % image.codeview.age
    assert PEImage.from_file(built["mingw"]).codeview is None


def test_load_config_tables_match_llvm_readobj(built):
    image = PEImage.from_file(built["clang"])
    text = _readobj(built["clang"], "--coff-load-config")

    def table(name):
        block = re.search(name + r" \[\n(.*?)\]", text, re.S).group(1)
        return [int(value, 16) - image.image_base for value in re.findall(r"0x[0-9A-F]+", block)]

    assert image.seh_handlers == table("SEHTable") and len(image.seh_handlers) == 1
    assert image.guard_functions == table("GuardFidTable") and len(image.guard_functions) >= 2


def test_claimed_sizes_allocate_nothing():
    data = bytearray(build_pe("x64", [Function("f", [b"\xc3"])]).data)
    optional = int.from_bytes(data[0x3C:0x40], "little") + 24
    data[optional + 56:optional + 60] = (0xFFFFFFFF).to_bytes(4, "little")
    image = PEImage.from_bytes(bytes(data))
    assert image.size_of_image == 0xFFFFFFFF
    assert image.read(0xFFFF0000, 4) is None and image.readable_span(0x1000, 0x10000000) < 0x10000


def test_truncated_file_reads_up_to_the_cut_and_reports_it():
    data = build_pe("x64", [Function("f", [b"\x90" * 0x40, b"\xc3"])]).data
    image = PEImage.from_bytes(data[:0x1000 + 0x20 if len(data) > 0x1020 else len(data) - 1])
    text = [s for s in image.sections if s.name == ".text"][0]
    assert image.read(text.rva, 0x20) is not None and image.read(text.rva, 0x21) is None
    assert [p.kind for p in image.problems] == ["pe_truncated"]


@pytest.mark.parametrize("raw, message", [
    (b"MZ", "truncated before the DOS header ends"),
    (b"ELF" + bytes(100), "no MZ header"),
    (b"MZ" + bytes(0x3A) + b"\xff\xff\x00\x00", "NT headers at 0xffff lie beyond the file"),
])
def test_unusable_headers_are_one_bad_input_line(raw, message):
    with pytest.raises(BadInput, match=message):
        PEImage.from_bytes(raw, "bad.dll")


@pytest.mark.parametrize("decorated, plain", [("_f", "f"), ("_f@12", "f"), ("@f@8", "f"), ("f", "f"),
                                              ("_a@b", "a@b")])
def test_x86_decorations_are_removed(decorated, plain):
    assert undecorate(decorated) == plain
