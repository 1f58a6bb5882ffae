"""The fake pykd behaves like pykd 0.3.4.15 as the reference describes it."""

import io
import json
import os
import sys

import pytest

import fake_pykd
from fake_pykd import make_fake_pykd
from dbgext.sample.scenario import Scenario
from pykd_support import DRIVER_BASE, NT_BASE, DebuggerOutput, kernel_scenario
from requirements import need_file

# The reference beside the repository (../shared/reference), never copied into it.
SURFACE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                       "shared", "reference", "pykd-0.3.4.15-surface.json")


def load_surface():
    """The pykd surface reference; the calling test is skipped (which fails the run)
    when the reference is not beside the repository."""
    with open(need_file(SURFACE, "the project's shared/reference beside the repository")) as handle:
        return json.load(handle)


@pytest.fixture
def kernel():
    scenario, at = kernel_scenario()
    return make_fake_pykd(scenario), at


# -- exceptions -----------------------------------------------------------------------

def test_exception_hierarchy_matches_pykd():
    assert issubclass(fake_pykd.MemoryException, fake_pykd.DbgException)
    assert issubclass(fake_pykd.TypeException, fake_pykd.SymbolException)
    assert issubclass(fake_pykd.SymbolException, fake_pykd.DbgException)
    assert issubclass(fake_pykd.DbgException, Exception)
    assert fake_pykd.MemoryException.__module__ == "pykd"
    assert issubclass(fake_pykd.ArgumentError, TypeError)


def test_unreadable_memory_raises_memory_exception_with_pykd_message(kernel):
    pykd, at = kernel
    with pytest.raises(pykd.MemoryException) as caught:
        pykd.ptrQWord(at.hole)
    assert str(caught.value) == "Memory exception at 0x%x target virtual address" % at.hole
    assert caught.value.args == (str(caught.value),)


def test_a_block_read_touching_a_hole_fails_as_a_whole_at_its_start(kernel):
    pykd, at = kernel
    start = at.hole - 8
    with pytest.raises(pykd.MemoryException) as caught:
        pykd.loadBytes(start, 16)
    assert "0x%x " % start in str(caught.value)
    assert pykd.loadBytes(start, 8) == [0xF8, 0xF9, 0xFA, 0xFB, 0xFC, 0xFD, 0xFE, 0xFF]


def test_a_scalar_read_crossing_into_a_hole_reports_the_first_unreadable_byte(kernel):
    pykd, at = kernel
    with pytest.raises(pykd.MemoryException) as caught:
        pykd.ptrQWord(at.hole - 4)
    assert "0x%x " % at.hole in str(caught.value)


def test_physical_reads_are_not_modelled_and_say_physical(kernel):
    pykd, at = kernel
    with pytest.raises(pykd.MemoryException, match="target physical address"):
        pykd.loadBytes(0x1000, 4, phyAddr=True)


# -- reads -----------------------------------------------------------------------------

def test_scalar_and_block_readers_decode_little_endian(kernel):
    pykd, at = kernel
    assert pykd.ptrByte(at.page + 0xFF) == 0xFF
    assert pykd.ptrSignByte(at.page + 0xFF) == -1
    assert pykd.ptrWord(at.page + 1) == 0x0201
    assert pykd.ptrDWord(at.page) == 0x03020100
    assert pykd.ptrQWord(at.page) == 0x0706050403020100
    assert pykd.ptrMWord(at.page) == pykd.ptrQWord(at.page)
    assert pykd.loadDWords(at.page, 2) == [0x03020100, 0x07060504]
    assert pykd.loadSignBytes(at.page + 0xFE, 2) == [-2, -1]
    assert pykd.loadBytes(at.page, 0) == []
    assert pykd.ptrPtr(at.pointers) == NT_BASE + 0x1010
    assert pykd.loadPtrs(at.pointers, 2) == [NT_BASE + 0x1010, 0x1234]


def test_strings(kernel):
    pykd, at = kernel
    assert pykd.loadCStr(at.text) == "Hello, WinDbg"
    assert pykd.loadChars(at.text, 5) == "Hello"
    assert pykd.loadWStr(at.wide) == "Wide"
    assert pykd.loadWChars(at.wide, 2) == "Wi"
    assert pykd.loadUnicodeString(at.unicode_string) == "Wide"


def test_narrow_strings_decode_strictly_as_utf8(kernel):
    pykd, at = kernel
    with pytest.raises(UnicodeDecodeError):
        pykd.loadChars(at.page + 0x80, 4)


def test_a_corrupt_unicode_string_is_a_dbg_exception():
    s = Scenario("x64", "kernel")
    address = s.alloc(0x10)
    s.pack(address, "<HHxxxxQ", 10, 4, address)
    pykd = make_fake_pykd(s)
    with pytest.raises(pykd.DbgException, match="Corrupted UNICODE_STRING structure"):
        pykd.loadUnicodeString(address)


def test_a_string_running_into_a_hole_is_a_memory_exception(kernel):
    pykd, at = kernel
    with pytest.raises(pykd.MemoryException):
        pykd.loadCStr(at.hole - 4)


def test_load_ptr_list_follows_flinks_to_the_head(kernel):
    pykd, at = kernel
    assert pykd.loadPtrList(at.head) == [w + 8 for w in at.widgets]


def test_load_ptr_list_over_a_cycle_fails_instead_of_hanging():
    s = Scenario("x64", "kernel")
    head, a, b = s.alloc(16), s.alloc(16), s.alloc(16)
    s.pack(head, "<Q", a)
    s.pack(a, "<Q", b)
    s.pack(b, "<Q", a)
    pykd = make_fake_pykd(s)
    with pytest.raises(fake_pykd.FakePykdHang):
        pykd.loadPtrList(head)


def test_validity_queries_and_search(kernel):
    pykd, at = kernel
    assert pykd.isValid(at.page) and not pykd.isValid(at.hole) and not pykd.isValid(0)
    assert pykd.isVaRegionValid(at.page, 0x1000) and not pykd.isVaRegionValid(at.page, 0x1001)
    assert pykd.searchMemory(at.text - 0x10, 0x40, "WinDbg") == at.text + 7
    assert pykd.searchMemory(at.text, 0x10, [0xDE, 0xAD]) == 0
    with pytest.raises(pykd.DbgException):
        pykd.searchMemory(at.text, 0x10, [])
    assert pykd.compareMemory(at.page, at.page + 0x100, 0x100)


# -- argument conventions ----------------------------------------------------------------

def test_keywords_only_where_pykd_declares_them(kernel):
    pykd, at = kernel
    assert pykd.loadBytes(offset=at.page, count=2) == [0, 1]
    with pytest.raises(fake_pykd.ArgumentError):
        pykd.ptrByte(addr=at.page)
    with pytest.raises(fake_pykd.ArgumentError):
        pykd.loadBytes(at.page, 2, physical=True)


def test_negative_addresses_overflow_and_wrong_types_are_argument_errors(kernel):
    pykd, at = kernel
    with pytest.raises(OverflowError):
        pykd.ptrByte(-1)
    with pytest.raises(TypeError):
        pykd.ptrByte("0x1000")
    with pytest.raises(TypeError):
        pykd.ptrByte(1.5)
    assert pykd.ptrByte(pykd.module("nt")) == 0  # numVariant objects convert to their value


def test_x86_pointers_are_sign_extended_like_addr64():
    s = Scenario("x86", "user")
    s.add_module("app", 0x80400000, 0x1000, image="app.exe")
    s.add_symbol("app", "main", 0x10)
    address = s.alloc(8)
    s.pack(address, "<I", 0x80400010)
    pykd = make_fake_pykd(s)
    assert pykd.ptrSize() == 4 and not pykd.is64bitSystem()
    assert pykd.ptrDWord(address) == 0x80400010
    assert pykd.ptrPtr(address) == 0xFFFFFFFF80400010
    assert pykd.addr64(0x80400010) == 0xFFFFFFFF80400010
    assert pykd.ptrByte(0xFFFFFFFF80400000) == pykd.ptrByte(0x80400000)
    assert pykd.getOffset("app!main") == 0xFFFFFFFF80400010
    assert pykd.findSymbol(0x80400012) == "app!main+2"
    with pytest.raises(pykd.MemoryException, match="0xffffffff90000000 "):
        pykd.ptrByte(0x90000000)


# -- symbols and modules -----------------------------------------------------------------

def test_find_symbol_formats_and_never_raises(kernel):
    pykd, at = kernel
    assert pykd.findSymbol(NT_BASE + 0x1000) == "nt!KiSystemStartup"
    assert pykd.findSymbol(NT_BASE + 0x101A) == "nt!KiSystemStartup+1a"
    assert pykd.findSymbol(NT_BASE + 0x101A, showDisplacement=False) == "nt!KiSystemStartup"
    assert pykd.findSymbol(NT_BASE + 0x20) == "nt+20"
    assert pykd.findSymbol(NT_BASE) == "nt"
    assert pykd.findSymbol(0x7FFD1234) == "7ffd1234"
    assert pykd.findSymbolAndDisp(NT_BASE + 0x2004) == ("nt", "KeBugCheckEx", 4)


def test_get_offset_errors_name_what_is_missing(kernel):
    pykd, at = kernel
    assert pykd.getOffset("nt!KeBugCheckEx") == NT_BASE + 0x2000
    assert pykd.getOffset("DriverEntry") == DRIVER_BASE + 0x1100
    with pytest.raises(pykd.SymbolException, match="^Nope symbol is not found$"):
        pykd.getOffset("nt!Nope")
    with pytest.raises(pykd.SymbolException, match="^failed to find module for symbol: Nope$"):
        pykd.getOffset("Nope")
    with pytest.raises(pykd.DbgException, match="^Failed to find module 'zz'$") as caught:
        pykd.getOffset("zz!Nope")
    assert type(caught.value) is pykd.DbgException


def test_module_objects(kernel):
    pykd, at = kernel
    nt = pykd.module("nt")
    assert int(nt) == NT_BASE == nt.begin() and nt.end() == NT_BASE + 0x20000 and nt.size() == 0x20000
    assert nt.name() == "nt" and nt.image() == "ntoskrnl.exe"
    assert nt + 0x10 == NT_BASE + 0x10 and nt == NT_BASE and hex(nt) == hex(NT_BASE)
    assert nt.KeBugCheckEx == NT_BASE + 0x2000 == nt["KeBugCheckEx"] == nt.offset("KeBugCheckEx")
    assert nt.rva("KeBugCheckEx") == 0x2000 and "KeBugCheckEx" in nt
    assert nt.findSymbol(NT_BASE + 0x1004) == "KiSystemStartup+4"
    assert pykd.module(NT_BASE + 0x1234).name() == "nt"
    with pytest.raises(AttributeError, match="'nt' module has not a symbol 'Nope'"):
        nt.Nope
    with pytest.raises(pykd.DbgException, match="Failed to find module"):
        pykd.module(nt.end())
    with pytest.raises(pykd.DbgException, match="Failed to find module 'zz'"):
        pykd.module("zz")
    assert [m.name() for m in pykd.getModulesList()] == ["nt", "mydrv"]


# -- types ---------------------------------------------------------------------------------

def test_type_info_from_isf(kernel):
    pykd, at = kernel
    widget = pykd.typeInfo("nt!_WIDGET")
    assert widget.size() == 0x28 and widget.name() == "_WIDGET"
    assert widget.fieldOffset("Tag") == 0x18
    assert widget.fieldOffset("Links.Blink") == 0x10
    assert widget.Links.name() == "_LIST_ENTRY" and widget.Size.size() == 4
    assert widget.field("Self").isPointer() and widget.field("Self").deref().name() == "_WIDGET"
    assert pykd.sizeof("nt!_LIST_ENTRY") == 0x10 and pykd.typeInfo("UInt4B[3]").size() == 12
    with pytest.raises(AttributeError, match="'_WIDGET' type has no field 'Nope'"):
        widget.Nope
    with pytest.raises(pykd.SymbolException):
        pykd.typeInfo("nt!_NOPE")
    with pytest.raises(pykd.TypeException):
        widget.deref()


def test_typed_var_reads_lazily_and_derefs_pointers(kernel):
    pykd, at = kernel
    first = pykd.typedVar("nt!_WIDGET", at.widgets[0])
    before = pykd.fake_calls["typedVar value"]
    assert int(first) == at.widgets[0]  # a struct's value is its address: no read
    assert pykd.fake_calls["typedVar value"] == before
    assert first.Size == 0x100 and int(first.Tag) == 0x74656757
    assert pykd.fake_calls["typedVar value"] == before + 2
    assert first.Self.Size == 0x100 and first.Links.Flink == at.widgets[1] + 8
    assert first.fieldOffset("Tag") == 0x18 and first.getAddress() == at.widgets[0]
    assert str(first.Size).startswith("ULong at 0x%x Value: 0x100" % at.widgets[0])
    nowhere = pykd.typedVar("UInt4B", 0)  # creating reads nothing ...
    with pytest.raises(pykd.MemoryException):
        int(nowhere)                        # ... the first use does


def test_typed_var_list_array_and_containing_record(kernel):
    pykd, at = kernel
    widgets = pykd.typedVarList(at.head, "nt!_WIDGET", "Links")
    assert [w.getAddress() for w in widgets] == at.widgets
    assert [int(w.Size) for w in widgets] == [0x100, 0x200, 0x300]
    record = pykd.containingRecord(at.widgets[1] + 8, "nt!_WIDGET", "Links")
    assert record.getAddress() == at.widgets[1]
    array = pykd.typedVarArray(at.page, "UInt2B", 3)
    assert [int(value) for value in array] == [0x0100, 0x0302, 0x0504]


def test_typed_var_list_accepts_a_dotted_flink_path(kernel):
    pykd, at = kernel
    widgets = pykd.typedVarList(at.head, "nt!_WIDGET", "Links.Flink")
    assert [w.getAddress() for w in widgets] == at.widgets


def test_typed_var_list_follows_a_singly_linked_next_pointer():
    s = Scenario("x64", "kernel")
    s.add_module("nt", NT_BASE, 0x1000)
    s.add_type("nt", "_NODE", 0x10, {"Value": 0})
    s.module_symbols["nt"].types["_NODE"]["fields"]["Next"] = {
        "offset": 8, "type": {"kind": "pointer", "subtype": {"kind": "struct", "name": "_NODE"}}}
    head, first, second = s.alloc(8), s.alloc(0x10), s.alloc(0x10)
    s.pack(head, "<Q", first)
    s.pack(first, "<QQ", 1, second)
    s.pack(second, "<QQ", 2, 0)
    pykd = make_fake_pykd(s)
    nodes = pykd.typedVarList(head, "nt!_NODE", "Next")
    assert [(n.getAddress(), int(n.Value)) for n in nodes] == [(first, 1), (second, 2)]


def test_byte_backed_typed_var_reads_no_target_memory(kernel):
    pykd, at = kernel
    raw = pykd.loadBytes(at.widgets[2], 0x28)
    calls = sum(pykd.fake_calls.values())
    widget = pykd.typedVar(pykd.typeInfo("nt!_WIDGET"), raw)
    assert widget.Size == 0x300
    assert sum(pykd.fake_calls.values()) == calls
    with pytest.raises(pykd.DbgException, match="python accessor error"):
        widget.getAddress()


# -- target facts, registers, threads -------------------------------------------------------

def test_target_facts_come_from_the_scenario(kernel):
    pykd, at = kernel
    assert pykd.ptrSize() == 8 and pykd.is64bitSystem()
    assert pykd.isKernelDebugging() and pykd.isDumpAnalyzing()
    assert pykd.bugCheckData() == (0xD1, 0x10, 2, 0, NT_BASE + 0x2010)
    assert pykd.getSystemVersion().buildNumber == 19045
    assert pykd.reg("rip") == NT_BASE + 0x2010 and pykd.getIP() == pykd.reg("RIP")
    assert pykd.getCurrentThread() == at.kthread == pykd.getImplicitThread()
    assert str(pykd.getCPUMode()) == "AMD64" and pykd.getCPUMode() == 1
    frames = pykd.getStack()
    assert len(frames) == 1 and frames[0].ip == NT_BASE + 0x2010
    assert str(frames[0]).startswith("Frame: IP=fffff80000002010  Return=0")
    with pytest.raises(pykd.DbgException):
        pykd.reg("nosuch")


def test_find_memory_region_is_user_mode_only(kernel):
    pykd, at = kernel
    with pytest.raises(pykd.DbgException):
        pykd.findMemoryRegion(at.page)
    s = Scenario("x64", "user")
    block = s.alloc_pages(0x2000)
    user = make_fake_pykd(s)
    assert user.findMemoryRegion(block - 0x5000) == (block, 0x2000)
    with pytest.raises(user.MemoryException):
        user.findMemoryRegion(block + 0x10000)


def test_a_live_user_session_has_no_bugcheck():
    s = Scenario("x64", "user")
    pykd = make_fake_pykd(s, dump=False)
    assert not pykd.isKernelDebugging() and not pykd.isDumpAnalyzing()
    with pytest.raises(pykd.DbgException):
        pykd.bugCheckData()


# -- output -----------------------------------------------------------------------------------

def test_dprint_uses_writedml_when_stdout_has_it(kernel, monkeypatch):
    pykd, _ = kernel
    debugger = DebuggerOutput()
    monkeypatch.setattr(sys, "stdout", debugger)
    assert pykd.isWindbgExt()
    pykd.dprintln("<b>x</b>", dml=True)
    pykd.dprint("plain")
    assert debugger.chunks == [("dml", "<b>x</b>\n"), ("text", "plain")]


def test_dprint_falls_back_to_write_outside_windbg(kernel, monkeypatch):
    pykd, _ = kernel
    console = io.StringIO()
    monkeypatch.setattr(sys, "stdout", console)
    assert not pykd.isWindbgExt()
    pykd.dprintln("<b>x</b>", dml=True)
    assert console.getvalue() == "<b>x</b>\n"
    with pytest.raises(TypeError):
        pykd.dprint(42)


# -- read-only and the surface ------------------------------------------------------------------

@pytest.mark.parametrize("call", [
    lambda p, a: p.setByte(a.page, 1),
    lambda p, a: p.writeBytes(a.page, [1]),
    lambda p, a: p.setReg("rax", 1),
    lambda p, a: p.go(),
    lambda p, a: p.setBp(a.page),
    lambda p, a: setattr(p.typedVar("nt!_WIDGET", a.widgets[0]), "Size", 1),
])
def test_everything_that_changes_the_target_fails_loudly(kernel, call):
    pykd, at = kernel
    with pytest.raises(fake_pykd.TargetModified):
        call(pykd, at)


def test_dbg_command_only_answers_canned_commands(kernel):
    pykd, _ = kernel
    pykd.fake_commands["version"] = "Windows 10 Kernel Version 19045"
    pykd.fake_commands["nothing"] = ""
    assert pykd.dbgCommand("version") == "Windows 10 Kernel Version 19045"
    assert pykd.dbgCommand("nothing") is None
    with pytest.raises(fake_pykd.FakePykdUnsupported):
        pykd.dbgCommand("!process 0 0")


def test_expr_evaluates_masm_numbers_and_symbols(kernel):
    pykd, _ = kernel
    assert pykd.expr("nt!KeBugCheckEx+10") == NT_BASE + 0x2010
    assert pykd.expr("0n16") == 16
    with pytest.raises(pykd.DbgException):
        pykd.expr("nt!Nope")


def test_calls_are_counted_per_function(kernel):
    pykd, at = kernel
    pykd.fake_calls.clear()
    pykd.ptrByte(at.page)
    pykd.ptrByte(at.page)
    pykd.loadBytes(at.page, 4)
    assert pykd.fake_calls == {"ptrByte": 2, "loadBytes": 1}


def test_the_fake_exposes_the_whole_pykd_surface(kernel):
    pykd, _ = kernel
    surface = load_surface()
    names = list(surface["functions"]) + list(surface["classes"]) + list(surface["enums"]) + \
        list(surface["exceptions"]) + list(surface["module_attributes"])
    assert [name for name in names if not hasattr(pykd, name)] == []
    for enum_name, members in surface["enums"].items():
        enum = getattr(pykd, enum_name)
        assert {name: int(getattr(enum, name)) for name in members} == members
    for class_name in ("module", "typeInfo", "typedVar"):
        cls = getattr(pykd, class_name)
        declared = surface["classes"][class_name]["methods"]
        missing = [m for m in declared if not hasattr(cls, m) and m not in ("__nonzero__", "__hex__", "__long__")]
        assert missing == [], class_name
    extra = [name for name in vars(pykd) if not name.startswith("_") and name not in names]
    assert sorted(extra) == ["fake_calls", "fake_commands", "fake_session"]


def test_the_fake_keeps_keyword_names_of_the_surface(kernel):
    pykd, _ = kernel
    surface = load_surface()
    import inspect
    for name, overloads in surface["functions"].items():
        function = getattr(pykd, name)
        wrapped = getattr(function, "__wrapped__", None)
        if wrapped is None:
            continue  # an unsupported/session-changing stub
        declared = overloads[0]["keywords"] or []
        parameters = inspect.signature(wrapped).parameters.values()
        keywords = [p.name for p in parameters if p.kind == p.POSITIONAL_OR_KEYWORD]
        assert keywords == declared, name
