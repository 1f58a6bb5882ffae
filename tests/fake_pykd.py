"""A faithful stand-in for the ``pykd`` 0.3.4.15 module, for tests on Linux.

Built from shared/reference/pykd-api.md (beside the repository): same function names, keyword names
(positional-only where pykd is), exception classes and message formats, and the
same memory semantics — block reads check the *whole* range first and never return
a partial result, scalar reads report the first unreadable address, ``findSymbol``
never raises, narrow strings are decoded strictly as UTF-8.

    fake = make_fake_pykd(scenario)          # or a Target, or a dump file path
    sys.modules["pykd"] = fake
    ...
    fake.fake_calls["loadBytes"]             # engine calls per function

The memory behind it is a dbgext Target (an in-memory Scenario image or a dump
opened with dbgext).  Anything that would change the target or the debugger
session raises :class:`TargetModified` (not a pykd exception, so extension code
catching ``DbgException`` cannot swallow it); API the fake cannot answer raises
:class:`FakePykdUnsupported` naming the function and why.
"""

import bisect
import fnmatch
import struct
import sys
import types
from collections import Counter

from dbgext.errors import DbgextError
from dbgext.target.base import Target

VERSION = "0.3.4.15"


# -- exceptions (pykd's hierarchy, message-only) ----------------------------------

class DbgException(Exception):
    """pykd base exception."""


class MemoryException(DbgException):
    """Target memory access exception."""


class SymbolException(DbgException):
    """Symbol exception."""


class TypeException(SymbolException):
    """Type exception."""


class CallException(DbgException):
    """Function call exception (never raised by pykd's translator)."""


class CPUException(DbgException):
    """CPU exception (never raised by pykd's translator)."""


class ArgumentError(TypeError):
    """Boost.Python.ArgumentError: arguments did not match any C++ signature."""


ArgumentError.__module__ = "Boost.Python"
for _exception in (DbgException, MemoryException, SymbolException, TypeException, CallException,
                   CPUException):
    _exception.__module__ = "pykd"


class TargetModified(AssertionError):
    """The code under test called a pykd function that changes the target or the
    debugger session; dbgext must stay read-only."""


class FakePykdUnsupported(NotImplementedError):
    """The fake cannot answer this call (the reason says why)."""


class FakePykdHang(AssertionError):
    """The real pykd would loop forever here (e.g. loadPtrList over a cycle)."""


def _memory_error(address, physical=False):
    return MemoryException("Memory exception at 0x%x target %s address"
                           % (address, "physical" if physical else "virtual"))


# -- enums (boost.python enums: int subclasses whose str() is the member name) ---

class _EnumValue(int):
    def __new__(cls, value, name, enum_name):
        member = int.__new__(cls, value)
        member.name = name
        member._enum_name = enum_name
        return member

    def __str__(self):
        return self.name

    def __repr__(self):
        return "pykd.%s.%s" % (self._enum_name, self.name)


def _make_enum(name, members):
    namespace = {"names": {}, "values": {}}
    for member_name, value in members.items():
        member = _EnumValue(value, member_name, name)
        namespace[member_name] = member
        namespace["names"][member_name] = member
        namespace["values"].setdefault(value, member)
    return type(name, (int,), namespace)


ENUMS = {
    "FileFlag": {"Debug": 1, "PreRelease": 2, "Patched": 4, "PrivateBuild": 8, "InfoInferred": 16,
                 "SpecialBuild": 32},
    "eventType": {"Breakpoint": 1, "Exception": 2, "CreateThread": 3, "ExitThread": 4,
                  "CreateProcess": 5, "ExitProcess": 6, "LoadModule": 7, "UnloadModule": 8,
                  "SystemError": 9, "SessionStatus": 10, "ChangeDebuggeeState": 11,
                  "ChangeEngineState": 12, "ChangeSymbolState": 13},
    "eventResult": {"Proceed": 0, "NoChange": 1, "Break": 2},
    "executionStatus": {"NoChange": 0, "Go": 1, "Break": 2, "NoDebuggee": 3},
    "callingConvention": {"NearC": 0, "FarC": 1, "NearPascal": 2, "FarPascal": 3, "NearFast": 4,
                          "FarFast": 5, "Skipped": 6, "NearStd": 7, "FarStd0": 8, "NearSys": 9,
                          "FarSys": 10, "ThisCall": 11, "MipsCall": 12, "Generic": 13,
                          "AlphaCall ": 14, "PpcCall": 15, "ShCall": 16, "ArmCall": 17,
                          "Am33Call": 18, "TriCall": 19, "Sh5Call": 20, "M32RCall": 21,
                          "ClrCall": 22, "Inline": 23},
    "CPUType": {"I386": 0, "AMD64": 1, "ARM64": 2, "ARM": 3},
    "Location": {"Reg": 2, "Memory": 1},
    "memoryProtect": {"PageNoAccess": 1, "PageReadOnly": 2, "PageReadWrite": 4, "PageWriteCopy": 2,
                      "PageExecute": 16, "PageExecuteRead": 32, "PageExecuteReadWrite": 64,
                      "PageExecuteWriteCopy": 128},
    "memoryState": {"Commit": 4096, "Reserve": 8192, "Free": 65536},
    "memoryType": {"Mapped": 262144, "Image": 16777216, "Private": 131072},
    "ProcessDebugOptions": {"BreakOnStart": 1, "BreakOnStop": 2, "DebugChildren": 4,
                            "NoDebugHeap": 8, "Default": 1},
    "debugOptions": {"AllowNetworkPaths": 4, "DisallowNetworkPaths": 8, "InitialBreak": 32,
                     "FinalBreak": 64, "FailIncompleteInformation": 512,
                     "DisableModuleSymbolLoad": 32768, "DisallowImageFileMapping": 131072,
                     "PreferDml": 262144},
    "breakpointAccess": {"Read": 1, "Write": 2, "Execute": 4},
    "outputFlag": {"Normal": 1, "Error": 2, "Warning": 4, "Verbose": 8, "Prompt": 16,
                   "PromptRegister": 32, "ExtensionWarning": 64, "Debuggee": 128,
                   "DebuggeePrompt": 256, "Symbols": 512, "Status": 1024, "All": 2047},
    "dumpType": {"Small": 1024, "Default": 1025, "Full": 1026, "Image": 1027, "KernelSmall": 1024,
                 "Kernel": 1025, "KernelFull": 1026},
    "dumpFormat": {"UserSmallFullMemory": 1, "UserSmallHandleData": 2,
                   "UserSmallUnloadedModules": 4, "UserSmallIndirectMemory": 8,
                   "UserSmallDataSegments": 16, "UserSmallFilterMemory": 32,
                   "UserSmallFilterPaths": 64, "UserSmallProcessThreadData": 128,
                   "UserSmallPrivateReadWriteMemory": 256, "UserSmallNoOptionalData": 512,
                   "UserSmallFullMemoryInfo": 1024, "UserSmallThreadInfo": 2048,
                   "UserSmallCodeSegments": 4096, "UserSmallNoAuxiliaryState": 8192,
                   "UserSmallFullAuxiliaryState": 16384, "UserSmallModuleHeaders": 32768,
                   "UserSmallFilterTriage": 65536, "UserSmallAddAvxXStateContext": 131072,
                   "UserSmallIptTrace": 262144, "UserSmallIgnoreInaccessibleMem": 134217728},
}


# -- the surface the fake does not serve ---------------------------------------------

# Functions that change the target or the debugger session -> TargetModified.
SESSION_CHANGING = (
    "setByte setWord setDWord setQWord setSignByte setSignWord setSignDWord setSignQWord setFloat "
    "setDouble setPtr writeBytes writeWords writeDWords writeQWords writeSignBytes writeSignWords "
    "writeSignDWords writeSignQWords writeFloats writeDoubles writeCStr writeWStr setReg setIP setSP "
    "setFP wrmsr stackAlloc stackFree pushStack popStack callFunctionByPtr callFunctionByAddr "
    "callFunctionRaw setBp removeBp removeAllBp go step trace stepout sourceStep sourceStepOver "
    "breakin killProcess killAllProcesses detachProcess detachAllProcesses writeDump "
    "addSyntheticSymbol removeSyntheticSymbol addSyntheticModule removeSyntheticModule "
    "setSymbolPath appendSymbolPath setSrcPath appendSrcPath setSymSrvDir setCPUMode switchCPUMode "
    "setCurrentProcess setCurrentProcessId setImplicitProcess setCurrentThread setCurrentThreadId "
    "setImplicitThread setFrame resetFrame setOutputMask changeDebugOptions startProcess "
    "attachProcess attachKernel loadDump closeDump remoteConnect initialize deinitialize loadExt "
    "removeExt callExt dinput"
).split()

# Read-only functions the fake cannot answer from a memory image, with the reason.
UNSUPPORTED = {
    "getSourceFile": "no source line information in a memory image",
    "getSourceFileFromSrcSrv": "no source server",
    "getSourceLine": "no source line information in a memory image",
    "getVaProtect": "no VAD/protection information in a memory image",
    "getVaType": "no VAD/protection information in a memory image",
    "getVaState": "no VAD/protection information in a memory image",
    "getVaAttributes": "no VAD/protection information in a memory image",
    "getDumpType": "dump flavour not modelled",
    "getDumpFormat": "dump flavour not modelled",
    "systemUptime": "not modelled",
    "currentTime": "not modelled",
    "getLocalProcesses": "describes the host machine, not the target",
    "isLocalKernelDebuggerEnabled": "describes the host machine, not the target",
    "getLastEvent": "no debug events in a memory image",
    "getLastException": "no debug events in a memory image",
    "getDebugOptions": "debugger options not modelled",
    "getOutputMask": "debugger output mask not modelled",
    "getExtensionSearchPath": "no debugger extensions",
    "createStruct": "C-source/custom type building is not modelled",
    "createUnion": "C-source/custom type building is not modelled",
    "defineFunction": "C-source/custom type building is not modelled",
    "getTypeFromSource": "C-source/custom type building is not modelled",
    "getTypeInfoProviderFromSource": "C-source/custom type building is not modelled",
    "getTypeInfoProviderFromPdb": "no PDB reader",
    "getSymbolProviderFromSource": "C-source/custom type building is not modelled",
    "evalExpr": "C-source/custom type building is not modelled",
    "rdmsr": "MSRs are not in a memory image",
    "getLocals": "no private symbols (locals/params)",
    "getLocal": "no private symbols (locals/params)",
    "getParams": "no private symbols (locals/params)",
    "getParam": "no private symbols (locals/params)",
    "getNumberBreakpoints": "no breakpoints on a read-only target",
    "getBp": "no breakpoints on a read-only target",
    "enumTagged": "tagged engine data not modelled",
    "loadTaggedBuffer": "tagged engine data not modelled",
    "getProcessIdBySystemID": "one process only",
    "getThreadIdByOffset": "thread ids are indexes into the scenario's thread list",
    "getThreadIdBySystemID": "thread ids are indexes into the scenario's thread list",
}

# Class members the fake leaves out, with the reason (the surface test reads this).
OMITTED_MEMBERS = {
    "module": {"reload": "changes the debugger session",
               "queryVersion": "no version resources", "getVersion": "no version resources",
               "getFixedFileInfo": "no version resources", "typedVarList": "use pykd.typedVarList",
               "typedVarArray": "use pykd.typedVarArray", "containingRecord": "use pykd.containingRecord",
               "findSymbolAndDisp": "use pykd.findSymbolAndDisp"},
    "typeInfo": {name: "C++ class introspection is not in ISF" for name in (
        "getNumberMethods", "method", "hasMethod", "methodName", "methods", "getNumberBaseClasses",
        "baseClass", "baseClassOffset", "baseClasses", "getTemplateArgs", "getCallingConvention",
        "getClassParent", "staticOffset", "append")},
    "typedVar": {"getDebugStart": "no function debug ranges", "getDebugEnd": "no function debug ranges",
                 "method": "calls target code", "hasMethod": "no C++ methods in ISF",
                 "call": "calls target code", "__call__": "calls target code",
                 "setField": "writes target memory", "__setattr__": "writes target memory",
                 "__setitem__": "writes target memory"},
}


def _unsupported(name, reason):
    raise FakePykdUnsupported("fake pykd: %s is not supported (%s)" % (name, reason))


def _session_changing(name):
    raise TargetModified("fake pykd: %s changes the target or the debugger session; "
                         "dbgext must stay read-only" % name)


# -- argument conversion --------------------------------------------------------------

def _number(value, what="address"):
    """pykd's unsigned long long converter: ints, bools and numVariant objects."""
    if isinstance(value, _NumVariant):
        value = value._numeric_value()
    if not isinstance(value, int):
        raise ArgumentError("Python argument types did not match C++ signature: %s must be an "
                            "integer, not %s" % (what, type(value).__name__))
    if value < 0 or value > 0xFFFFFFFFFFFFFFFF:
        raise OverflowError("can't convert %d to unsigned long long" % value)
    return int(value)


def _count(value):
    value = _number(value, "count")
    if value > 0xFFFFFFFF:
        raise OverflowError("can't convert %d to unsigned long" % value)
    return value


def _text(value, what="str"):
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if not isinstance(value, str):
        raise ArgumentError("Python argument types did not match C++ signature: %s must be str, "
                            "not %s" % (what, type(value).__name__))
    return value


# -- type descriptions -------------------------------------------------------------------

# ISF base type name -> (pykd name, size, signed, kind)
_ISF_BASE = {
    "unsigned char": ("UInt1B", 1, False, "int"), "char": ("Char", 1, True, "int"),
    "signed char": ("Int1B", 1, True, "int"), "unsigned short": ("UInt2B", 2, False, "int"),
    "short": ("Int2B", 2, True, "int"), "unsigned int": ("UInt4B", 4, False, "int"),
    "int": ("Int4B", 4, True, "int"), "unsigned long": ("ULong", 4, False, "int"),
    "long": ("Long", 4, True, "int"), "unsigned long long": ("UInt8B", 8, False, "int"),
    "long long": ("Int8B", 8, True, "int"), "unsigned __int64": ("UInt8B", 8, False, "int"),
    "__int64": ("Int8B", 8, True, "int"), "wchar": ("WChar", 2, False, "int"),
    "wchar_t": ("WChar", 2, False, "int"), "bool": ("Bool", 1, False, "int"),
    "float": ("Float", 4, True, "float"), "double": ("Double", 8, True, "float"),
}

# pykd base type name -> (size, signed, kind)
_PYKD_BASE = {
    "UInt1B": (1, False, "int"), "UInt2B": (2, False, "int"), "UInt4B": (4, False, "int"),
    "UInt8B": (8, False, "int"), "Int1B": (1, True, "int"), "Int2B": (2, True, "int"),
    "Int4B": (4, True, "int"), "Int8B": (8, True, "int"), "Long": (4, True, "int"),
    "ULong": (4, False, "int"), "Bool": (1, False, "int"), "Char": (1, True, "int"),
    "WChar": (2, False, "int"), "Float": (4, True, "float"), "Double": (8, True, "float"),
}


class _TypeDesc(object):
    """What the fake knows about one type (kind: base, pointer, array, struct, enum,
    bitfield, void)."""

    def __init__(self, kind, name, size, signed=False, scalar="int", target=None, count=0,
                 fields=None, module=None, bit_position=0, bit_length=0):
        self.kind = kind
        self.name = name
        self.size = size
        self.signed = signed
        self.scalar = scalar  # "int" or "float" for base types
        self.target = target  # pointee / element / bitfield storage
        self.count = count
        self.fields = fields  # list of (name, offset, _TypeDesc) for structs
        self.module = module
        self.bit_position = bit_position
        self.bit_length = bit_length

    def field(self, name):
        for field_name, offset, desc in self.fields or ():
            if field_name == name:
                return offset, desc
        return None


# -- the session: memory, symbols, state -------------------------------------------------

class _ThreadFacts(object):
    """One thread, from a Scenario Thread or a backend's info() dict."""

    def __init__(self, thread):
        get = thread.get if isinstance(thread, dict) else (lambda name, default=0: getattr(thread, name, default))
        self.thread_id = get("thread_id", 0)
        self.teb = get("teb", 0)
        self.kthread = get("kthread", 0)
        self.registers = {name.lower(): value for name, value in (get("registers", None) or {}).items()}


class _Session(object):
    def __init__(self, target, mode, dump, registers, threads, bugcheck, build, stack, process):
        self.target = target
        self.ptr_size = target.pointer_size
        self.arch = target.arch   # "x64", "x86" or "arm64": the CPUType the fake reports
        self.mode = mode
        self.dump = dump
        self.registers = {name.lower(): value for name, value in registers.items()}
        self.threads = [_ThreadFacts(thread) for thread in threads]
        self.bugcheck = tuple(bugcheck) if bugcheck else None
        self.build = build
        self.stack = stack
        self.process = process
        self.calls = Counter()
        self.commands = {}
        self._types = {}

    # memory -------------------------------------------------------------------

    def addr64(self, address):
        if self.ptr_size == 4 and address >> 32 == 0 and address & 0x80000000:
            return address | 0xFFFFFFFF00000000
        return address

    def _va(self, normalised):
        """The target's own virtual address, or None when it cannot exist."""
        if self.ptr_size == 4:
            if normalised >> 32 not in (0, 0xFFFFFFFF):
                return None
            return normalised & 0xFFFFFFFF
        return normalised

    def read_block(self, address, size, physical=False):
        """Whole-range semantics: either all ``size`` bytes or MemoryException at the start."""
        normalised = self.addr64(address)
        if physical:
            raise _memory_error(normalised, physical=True)
        va = self._va(normalised)
        if va is None or not self.target.is_readable(va, size):
            raise _memory_error(normalised)
        return self.target.read(va, size) if size else b""

    def read_scalar(self, address, size):
        """One engine read: a short read reports the first byte it could not read."""
        normalised = self.addr64(address)
        va = self._va(normalised)
        if va is None:
            raise _memory_error(normalised)
        partial = self.target.try_read(va, size)
        if partial.holes:
            raise _memory_error(normalised + (partial.holes[0][0] - va))
        return partial.data

    def is_valid(self, address, size=1):
        va = self._va(self.addr64(address))
        return va is not None and self.target.is_readable(va, size)

    def follow_links(self, api, head, next_offset=0):
        """The entries pykd's list walkers visit: from the pointer at ``head``, each
        next one at ``entry + next_offset``, stopping at 0 or back at the head.  A
        loop that misses the head raises where the real pykd would hang."""
        seen = set()
        entry = self.read_pointer(head)
        while entry != 0 and entry != head:
            if entry in seen:
                raise FakePykdHang("fake pykd: %s(0x%x) loops at 0x%x without returning to the head; "
                                   "the real pykd would hang" % (api, head, entry))
            seen.add(entry)
            yield entry
            entry = self.read_pointer(entry + next_offset)

    def read_pointer(self, address):
        data = self.read_scalar(address, self.ptr_size)
        return self.addr64(int.from_bytes(data, "little"))

    # modules and symbols --------------------------------------------------------

    def modules(self):
        return self.target.modules()

    def module_named(self, name):
        return self.target.module_named(name)

    def module_at(self, address):
        va = self._va(self.addr64(address))
        return self.target.module_at(va) if va is not None else None

    def module_symbols(self, module):
        symbols = self.target.symbols
        lookup = getattr(symbols, "module_symbols", None)
        return lookup(module.name) if lookup else None

    def symbol_rva(self, module, name):
        table = self.module_symbols(module)
        if table is None:
            return None
        return table.symbols.get(name)

    def get_offset(self, name):
        if "!" in name:
            module_name, symbol = name.split("!", 1)
            module = self.module_named(module_name)
            if module is None:
                raise DbgException("Failed to find module '%s'" % module_name)
            rva = self.symbol_rva(module, symbol)
            if rva is None:
                raise SymbolException("%s symbol is not found" % symbol)
            return self.addr64(module.base + rva)
        for module in self.modules():
            rva = self.symbol_rva(module, name)
            if rva is not None:
                return self.addr64(module.base + rva)
        raise SymbolException("failed to find module for symbol: %s" % name)

    def nearest_symbol(self, module, address):
        """(symbol name, displacement) of the nearest symbol at or below, or None."""
        table = self.module_symbols(module)
        if table is None or not table.symbols:
            return None
        rvas, names = table.sorted_symbols()
        index = bisect.bisect_right(rvas, address - module.base) - 1
        if index < 0:
            return None
        return names[index], address - module.base - rvas[index]

    # types -------------------------------------------------------------------------

    def type_desc(self, name):
        """A _TypeDesc for a pykd type expression, or TypeException/SymbolException."""
        if name in self._types:
            return self._types[name]
        desc = self._parse_type(name)
        self._types[name] = desc
        return desc

    def _parse_type(self, name):
        text = name.strip()
        if text.endswith("*"):
            return self.pointer_to(self.type_desc(text[:-1]))
        if text.endswith("]") and "[" in text:
            base, count = text[:-1].rsplit("[", 1)
            try:
                count = int(count, 0)
            except ValueError:
                raise TypeException("%s : invalid type name" % name)
            return self.array_of(self.type_desc(base), count)
        if text in _PYKD_BASE:
            size, signed, scalar = _PYKD_BASE[text]
            return _TypeDesc("base", text, size, signed, scalar)
        if text in ("Void", "void"):
            return _TypeDesc("void", "Void", 0)
        if text == "VoidPtr":
            return self.pointer_to(_TypeDesc("void", "Void", 0))
        module_name = None
        bare = text
        if "!" in text:
            module_name, bare = text.split("!", 1)
            module = self.module_named(module_name)
            if module is None:
                raise DbgException("Failed to find module '%s'" % module_name)
            candidates = [module]
        else:
            candidates = self.modules()
        for module in candidates:
            table = self.module_symbols(module)
            if table is not None and bare in table.types:
                return self._user_type(module.name, bare, table.types[bare])
        raise SymbolException("'%s' - symbol is not found" % text)

    def _user_type(self, module_name, name, entry):
        desc = _TypeDesc("struct", name, entry["size"], module=module_name)
        self._types["%s!%s" % (module_name, name)] = desc
        fields = []
        for field_name, field in sorted(entry["fields"].items(), key=lambda item: item[1]["offset"]):
            fields.append((field_name, field["offset"], self._isf_type(module_name, field.get("type", {}))))
        desc.fields = fields
        return desc

    def _isf_type(self, module_name, spec):
        kind = spec.get("kind")
        if kind == "pointer":
            return self.pointer_to(self._isf_type(module_name, spec.get("subtype", {"kind": "void"})))
        if kind == "array":
            return self.array_of(self._isf_type(module_name, spec.get("subtype", {})), spec.get("count", 0))
        if kind == "bitfield":
            storage = self._isf_type(module_name, spec.get("type", {}))
            return _TypeDesc("bitfield", "%s:%d" % (storage.name, spec.get("bit_length", 0)), storage.size,
                             storage.signed, target=storage, bit_position=spec.get("bit_position", 0),
                             bit_length=spec.get("bit_length", 0))
        if kind in ("struct", "union", "class"):
            try:
                return self.type_desc("%s!%s" % (module_name, spec.get("name")))
            except DbgException:
                return _TypeDesc("void", spec.get("name") or "Void", 0)
        if kind == "enum":
            return _TypeDesc("enum", spec.get("name", "enum"), 4, False)
        if kind == "void":
            return _TypeDesc("void", "Void", 0)
        base_name = spec.get("name", "unsigned long long")
        if base_name == "pointer":
            return self.pointer_to(_TypeDesc("void", "Void", 0))
        pykd_name, size, signed, scalar = _ISF_BASE.get(
            base_name, ("UInt%dB" % self.ptr_size, self.ptr_size, False, "int"))
        return _TypeDesc("base", pykd_name, size, signed, scalar)

    def pointer_to(self, desc, size=0):
        return _TypeDesc("pointer", desc.name + "*", size or self.ptr_size, target=desc)

    def array_of(self, desc, count):
        return _TypeDesc("array", "%s[%d]" % (desc.name, count), desc.size * count, target=desc,
                         count=count)

    # value decoding ------------------------------------------------------------------

    def decode(self, desc, data):
        """The number a scalar type's bytes stand for."""
        if desc.kind == "bitfield":
            raw = int.from_bytes(data, "little")
            value = (raw >> desc.bit_position) & ((1 << desc.bit_length) - 1)
            if desc.signed and value >> (desc.bit_length - 1):
                value -= 1 << desc.bit_length
            return value
        if desc.kind == "pointer":
            return self.addr64(int.from_bytes(data, "little"))
        if desc.scalar == "float":
            return struct.unpack("<f" if desc.size == 4 else "<d", data)[0]
        return int.from_bytes(data, "little", signed=desc.signed)


# -- numVariant and the object classes --------------------------------------------------

class _NumVariant(object):
    """pykd.numVariant: a number-like object (comparisons and arithmetic on its value)."""

    def _numeric_value(self):
        raise NotImplementedError

    def _int(self):
        return int(self._numeric_value())

    def __int__(self):
        return self._int()

    def __index__(self):
        return self._int()

    def __float__(self):
        return float(self._numeric_value())

    def __hash__(self):
        return self._int()

    def __bool__(self):
        return self._int() != 0

    def isInteger(self):
        return isinstance(self._numeric_value(), int)

    def __eq__(self, other):
        if other is None:
            return False
        return self._int() == _operand(other)

    def __ne__(self, other):
        if other is None:
            return True
        return self._int() != _operand(other)

    def __lt__(self, other):
        return self._int() < _operand(other)

    def __le__(self, other):
        return self._int() <= _operand(other)

    def __gt__(self, other):
        return self._int() > _operand(other)

    def __ge__(self, other):
        return self._int() >= _operand(other)

    def __neg__(self):
        return -self._int()

    def __pos__(self):
        return self._int()

    def __invert__(self):
        return ~self._int()


def _operand(value):
    if isinstance(value, _NumVariant):
        return value._int()
    return value


def _binary(operator_name):
    def forward(self, other):
        return getattr(self._int(), operator_name)(_operand(other))

    def reflected(self, other):
        return getattr(_operand(other), operator_name)(self._int())

    return forward, reflected


for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "lshift", "rshift", "and", "or", "xor"):
    _forward, _reflected = _binary("__%s__" % _name)
    setattr(_NumVariant, "__%s__" % _name, _forward)
    setattr(_NumVariant, "__r%s__" % _name, _reflected)


def _not_constructible(name):
    def __init__(self, *args, **kwargs):
        raise RuntimeError("This class cannot be instantiated from Python")
    return type(name, (object,), {"__init__": __init__})


# -- building the module ----------------------------------------------------------------------

def make_fake_pykd(source, mode=None, dump=True, registers=None, threads=None, bugcheck=None,
                   build=None, stack=None, process=0, symbols=None):
    """A fresh ``pykd`` module backed by ``source``.

    ``source``: a Scenario, a dbgext Target, or a dump file path.  ``mode``
    ("kernel"/"user"), ``registers``, ``threads``, ``bugcheck`` and ``build`` default
    to the scenario's (or the Target's info()); ``dump=False`` models a live session;
    ``stack`` is a list of (ip, return, frame, stack) tuples for getStack (default:
    one frame from the registers); ``process`` is getCurrentProcess()'s answer.
    """
    target, facts = _open_source(source, symbols)
    mode = mode or facts.get("mode") or "kernel"
    registers = registers if registers is not None else facts.get("registers") or {}
    threads = threads if threads is not None else facts.get("threads") or []
    if bugcheck is None:
        bugcheck = facts.get("bugcheck")
    build = build if build is not None else facts.get("build") or 19041
    session = _Session(target, mode, dump, registers, threads, bugcheck, build, stack, process)
    return _build_module(session)


def _open_source(source, symbols):
    from dbgext.sample.scenario import Scenario
    if isinstance(source, Scenario):
        facts = source.info()
        facts["threads"] = source.threads
        return source.target(), facts
    if isinstance(source, Target):
        return source, dict(source.info())
    if isinstance(source, str):
        from dbgext.target import open_dump
        target = open_dump(source, symbols=symbols)
        return target, dict(target.info())
    raise DbgextError("fake pykd needs a Scenario, a Target or a dump path, not %r" % (source,))


def _build_module(session):
    fake = types.ModuleType("pykd", "Fake pykd %s for tests (dbgext.sample.fake_pykd)" % VERSION)
    api = {}

    def export(function):
        """Register ``function`` under its name, counting every call.  Keywords are
        accepted only where pykd declares them (ArgumentError otherwise, as boost.python)."""
        name = function.__name__
        counts = session.calls
        code = function.__code__
        keywords = frozenset(code.co_varnames[code.co_posonlyargcount:code.co_argcount])

        def call(*args, **kwargs):
            counts[name] += 1
            if kwargs and not keywords.issuperset(kwargs):
                raise ArgumentError("Python argument types in pykd.%s did not match C++ signature: "
                                    "keywords %s" % (name, ", ".join(sorted(kwargs))))
            return function(*args, **kwargs)

        call.__name__ = name
        call.__doc__ = function.__doc__
        call.__wrapped__ = function
        api[name] = call
        return call

    ptr = session.ptr_size

    # ---- memory: scalars ----
    def scalar_reader(name, size, signed, kind="int"):
        def reader(addr, /):
            data = session.read_scalar(_number(addr), size)
            if kind == "float":
                return struct.unpack("<f" if size == 4 else "<d", data)[0]
            return int.from_bytes(data, "little", signed=signed)
        reader.__name__ = name
        export(reader)

    for name, size, signed in (("ptrByte", 1, False), ("ptrWord", 2, False), ("ptrDWord", 4, False),
                               ("ptrQWord", 8, False), ("ptrMWord", ptr, False), ("ptrSignByte", 1, True),
                               ("ptrSignWord", 2, True), ("ptrSignDWord", 4, True),
                               ("ptrSignQWord", 8, True), ("ptrSignMWord", ptr, True)):
        scalar_reader(name, size, signed)
    scalar_reader("ptrFloat", 4, True, "float")
    scalar_reader("ptrDouble", 8, True, "float")

    @export
    def ptrPtr(addr, /):
        return session.read_pointer(_number(addr))

    # ---- memory: blocks ----
    def block_reader(name, fmt_char, size, keyword="offset"):
        def reader(offset, count, phyAddr=False):
            count = _count(count)
            data = session.read_block(_number(offset), count * size, bool(phyAddr))
            if fmt_char == "B":
                return list(data)
            return list(struct.unpack("<%d%s" % (count, fmt_char), data))
        reader.__name__ = name
        export(reader)

    for name, fmt_char, size in (("loadBytes", "B", 1), ("loadWords", "H", 2), ("loadDWords", "I", 4),
                                 ("loadQWords", "Q", 8), ("loadSignBytes", "b", 1),
                                 ("loadSignWords", "h", 2), ("loadSignDWords", "i", 4),
                                 ("loadSignQWords", "q", 8), ("loadFloats", "f", 4),
                                 ("loadDoubles", "d", 8)):
        block_reader(name, fmt_char, size)

    @export
    def loadChars(address, count, phyAddr=False):
        return session.read_block(_number(address), _count(count), bool(phyAddr)).decode("utf-8")

    @export
    def loadWChars(address, count, phyAddr=False):
        data = session.read_block(_number(address), _count(count) * 2, bool(phyAddr))
        return data.decode("utf-16-le")

    def terminated(address, unit, limit=0x10000):
        """A NUL-terminated string's bytes (at most ``limit``), or MemoryException at its start."""
        start = session.addr64(_number(address))
        terminator = b"\0" * unit
        collected = bytearray()
        checked = 0
        cursor = start
        while len(collected) < limit:
            va = session._va(cursor)
            if va is None:
                break
            span = min(0x1000 - (va & 0xFFF), limit - len(collected))
            partial = session.target.try_read(va, span)
            good = span if not partial.holes else partial.holes[0][0] - va
            collected += partial.data[:good]
            index = collected.find(terminator, checked)
            while index != -1 and index % unit:
                index = collected.find(terminator, index + 1)
            if index != -1:
                return bytes(collected[:index])
            checked = max(0, len(collected) - unit)
            if good < span:
                break
            cursor += span
        raise _memory_error(start)

    @export
    def loadCStr(offset, /):
        return terminated(offset, 1).decode("utf-8")

    @export
    def loadWStr(offset, /):
        return terminated(offset, 2).decode("utf-16-le")

    def counted_string(offset, unit):
        offset = _number(offset)
        length, maximum = struct.unpack("<HH", session.read_scalar(offset, 4))
        buffer = session.read_pointer(offset + ptr)
        if length == 0:
            return ""
        if maximum < length:
            raise DbgException("Corrupted %s structure" % ("UNICODE_STRING" if unit == 2 else "ANSI_STRING"))
        data = session.read_block(buffer, length - length % unit)
        return data.decode("utf-16-le" if unit == 2 else "utf-8")

    @export
    def loadUnicodeString(offset, /):
        return counted_string(offset, 2)

    @export
    def loadAnsiString(offset, /):
        return counted_string(offset, 1)

    @export
    def loadPtrs(offset, count, /):
        count = _count(count)
        data = session.read_block(_number(offset), count * ptr)
        return [session.addr64(value) for value in struct.unpack("<%d%s" % (count, "Q" if ptr == 8 else "I"), data)]

    @export
    def loadPtrList(offset, /):
        return list(session.follow_links("loadPtrList", session.addr64(_number(offset))))

    # ---- memory: queries ----
    @export
    def addr64(addr, /):
        return session.addr64(_number(addr))

    @export
    def isValid(addr, /):
        return session.is_valid(_number(addr))

    @export
    def isVaRegionValid(addr, length, /):
        return session.is_valid(_number(addr), _count(length))

    @export
    def compareMemory(offset1, offset2, length, phyAddr=False):
        length = _count(length)
        return (session.read_block(_number(offset1), length, bool(phyAddr))
                == session.read_block(_number(offset2), length, bool(phyAddr)))

    @export
    def searchMemory(offset, length, pattern, /):
        offset, length = _number(offset), _number(length, "length")
        if isinstance(pattern, str):
            needle = pattern.encode("utf-8")
        else:
            try:
                needle = bytes(pattern)
            except (TypeError, ValueError):
                raise ArgumentError("Python argument types did not match C++ signature: pattern")
        if not needle:
            raise DbgException("search pattern is empty")
        va = session._va(session.addr64(offset))
        if va is None:
            return 0
        found = session.target.scan(needle, va, va + length, limit=1)
        return session.addr64(found[0]) if found else 0

    @export
    def findMemoryRegion(offset, /):
        if session.mode == "kernel":
            raise DbgException("Call IDebugDataSpace4::QueryVirtual failed\nHRESULT 0x80004001")
        normalised = session.addr64(_number(offset))
        va = session._va(normalised)
        regions = session.target.readable_ranges(va) if va is not None else iter(())
        for start, end in regions:
            return session.addr64(start), end - start
        raise _memory_error(normalised)

    @export
    def pageSize():
        return 0x1000

    # ---- target facts ----
    @export
    def ptrSize():
        return ptr

    @export
    def is64bitSystem():
        return ptr == 8

    @export
    def isKernelDebugging():
        return session.mode == "kernel"

    @export
    def isDumpAnalyzing():
        return bool(session.dump)

    @export
    def isWindbgExt():
        return hasattr(sys.stdout, "writedml")

    cpu_type = {"x64": "AMD64", "x86": "I386", "arm64": "ARM64"}[session.arch]

    @export
    def getCPUType():
        return getattr(fake.CPUType, cpu_type)

    @export
    def getCPUMode():
        return getattr(fake.CPUType, cpu_type)

    @export
    def getExecutionStatus():
        return fake.executionStatus.Break

    @export
    def bugCheckData():
        if session.mode != "kernel" or not session.dump or session.bugcheck is None:
            raise DbgException("Call IDebugControl::ReadBugCheckData failed\nHRESULT 0x80004001")
        return tuple(session.bugcheck)

    class systemVersion(object):
        def __init__(self):
            object.__setattr__(self, "win32Major", 10)
            object.__setattr__(self, "win32Minor", 0)
            object.__setattr__(self, "servicePack", "")
            object.__setattr__(self, "buildNumber", session.build)
            object.__setattr__(self, "buildString", "%d.1.amd64fre.vb_release.191206-1406" % session.build)

        def __setattr__(self, name, value):
            raise AttributeError("can't set attribute")

        def __str__(self):
            return ("Major Version: %d\nMinor Version: %d\nBuild: %d\nDescription: %s"
                    % (self.win32Major, self.win32Minor, self.buildNumber, self.buildString))

    @export
    def getSystemVersion():
        return systemVersion()

    @export
    def getHostProcessPath():
        return "C:\\Program Files (x86)\\Windows Kits\\10\\Debuggers\\x64\\windbg.exe"

    @export
    def getSymbolPath():
        return ""

    @export
    def getSrcPath():
        return ""

    # ---- output ----
    def output(text, dml, newline):
        text = _text(text)
        if newline:
            text += "\n"
        stream = sys.stdout
        if dml and hasattr(stream, "writedml"):
            stream.writedml(text)
        else:
            stream.write(text)

    @export
    def dprint(str, dml=False):  # noqa: A002 - pykd's keyword is named "str"
        output(str, dml, False)

    @export
    def dprintln(str, dml=False):  # noqa: A002
        output(str, dml, True)

    @export
    def setStatusMessage(text, /):
        _text(text)

    @export
    def dbgCommand(command, suppressOutput=True, outputMask=1):
        """Canned output from ``fake.fake_commands[command]`` (str or callable);
        the fake runs no real debugger commands."""
        command = _text(command)
        if command not in session.commands:
            _unsupported("dbgCommand(%r)" % command, "no canned output; add it to fake_commands")
        answer = session.commands[command]
        text = answer() if callable(answer) else answer
        if not suppressOutput:
            sys.stdout.write(text or "")
            return None
        return text or None

    @export
    def expr(expression, cplusplus=False):
        from dbgext.address import evaluate
        try:
            return evaluate(_text(expression), _SessionSymbols(session))
        except DbgextError:
            raise DbgException("Call IDebugControl::Evaluate failed\nHRESULT 0x80004005")

    # ---- symbols ----
    @export
    def getOffset(name, /):
        return session.get_offset(_text(name))

    @export
    def findSymbol(offset, showDisplacement=True):
        address = session.addr64(_number(offset))
        module = session.module_at(address)
        if module is None:
            return "%x" % address
        va = session._va(address)
        nearest = session.nearest_symbol(module, va)
        if nearest is None:
            displacement = va - module.base
            if showDisplacement and displacement:
                return "%s+%x" % (module.name, displacement)
            return module.name
        symbol, displacement = nearest
        if showDisplacement and displacement:
            return "%s!%s+%x" % (module.name, symbol, displacement)
        return "%s!%s" % (module.name, symbol)

    @export
    def findSymbolAndDisp(offset, /):
        address = session.addr64(_number(offset))
        module = session.module_at(address)
        if module is None:
            raise DbgException("Failed to find module by offset %x" % address)
        nearest = session.nearest_symbol(module, session._va(address))
        if nearest is None:
            raise SymbolException("symbol is not found at offset %x" % address)
        return module.name, nearest[0], nearest[1]

    @export
    def sizeof(name, /):
        return session.type_desc(_text(name)).size

    # ---- classes ----
    class module(_NumVariant):
        def __init__(self, nameOrAddress):
            if isinstance(nameOrAddress, (str, bytes)):
                name = _text(nameOrAddress)
                found = session.module_named(name)
                if found is None:
                    raise DbgException("Failed to find module '%s'" % name)
            else:
                address = _number(nameOrAddress)
                found = session.module_at(address)
                if found is None:
                    raise DbgException("Failed to find module by offset %x" % session.addr64(address))
            self._module = found

        def _numeric_value(self):
            return session.addr64(self._module.base)

        def begin(self):
            return session.addr64(self._module.base)

        def end(self):
            return session.addr64(self._module.base + self._module.size)

        def size(self):
            return self._module.size

        def name(self):
            return self._module.name

        def image(self):
            return self._module.image

        def offset(self, name):
            rva = session.symbol_rva(self._module, _text(name))
            if rva is None:
                raise SymbolException("%s symbol is not found" % name)
            return session.addr64(self._module.base + rva)

        def rva(self, name):
            return self.offset(name) - self.begin()

        def sizeof(self, name):
            return self.type(name).size()

        def type(self, name):
            return typeInfo("%s!%s" % (self._module.name, _text(name)))

        def typedVar(self, *args):
            if len(args) == 2:
                type_arg, location = args
                if not isinstance(type_arg, typeInfo):
                    type_arg = self.type(type_arg)
                return typedVar(type_arg, location)
            if len(args) == 1 and isinstance(args[0], (str, bytes)):
                return typedVar("%s!%s" % (self._module.name, _text(args[0])))
            raise ArgumentError("Python argument types did not match C++ signature: module.typedVar")

        def findSymbol(self, offset, showDisplacement=True):
            full = findSymbol(offset, showDisplacement)
            return full.split("!", 1)[1] if "!" in full else full

        def enumSymbols(self, mask="*"):
            table = session.module_symbols(self._module)
            names = sorted(table.symbols) if table else []
            return [(name, session.addr64(self._module.base + table.symbols[name]))
                    for name in names if fnmatch.fnmatchcase(name, mask)]

        def enumTypes(self, mask="*"):
            table = session.module_symbols(self._module)
            return [name for name in sorted(table.types) if fnmatch.fnmatchcase(name, mask)] if table else []

        def symfile(self):
            """The debugger's symbol file: a module the scenario has symbols for is
            one WinDbg loaded a PDB for; the others have none ("")."""
            table = session.module_symbols(self._module)
            if table is None or not table.symbols:
                return ""
            return "c:\\symbols\\%s.pdb" % self._module.image.rsplit(".", 1)[0]

        def hasSymbol(self, name):
            table = session.module_symbols(self._module)
            return bool(table) and (name in table.symbols or name in table.types)

        def __contains__(self, name):
            return self.hasSymbol(name)

        def _lookup(self, name):
            table = session.module_symbols(self._module)
            if table is not None and name in table.symbols:
                return session.addr64(self._module.base + table.symbols[name])
            if table is not None and name in table.types:
                return self.type(name)
            return None

        def __getattr__(self, name):
            if name.startswith("_"):
                raise AttributeError(name)
            value = self._lookup(name)
            if value is None:
                raise AttributeError("'%s' module has not a symbol '%s'" % (self._module.name, name))
            return value

        def __getitem__(self, name):
            value = self._lookup(name)
            if value is None:
                raise KeyError("'%s' module has not a symbol '%s'" % (self._module.name, name))
            return value

        def checksum(self):
            return self._pe_header_field(0x58, 4)

        def timestamp(self):
            return self._pe_header_field(0x8, 4)

        def _pe_header_field(self, offset, size):
            """A field of the image's PE header (offset from the 'PE' signature), 0 if unreadable."""
            base = self._module.base
            if not session.target.is_readable(base, 0x40):
                return 0
            pe = base + session.target.u32(base + 0x3C)
            if not session.target.is_readable(pe + offset, size):
                return 0
            return int.from_bytes(session.target.read(pe + offset, size), "little")

        def unloaded(self):
            return False

        def um(self):
            return session.mode == "user"

        def __str__(self):
            return ("Module: %s\nStart: %x End: %x Size: %x\nImage: %s\nSymbols: %s\nTimestamp: %x\n"
                    "Check Sum: %x" % (self.name(), self.begin(), self.end(), self.size(), self.image(),
                                       "ISF" if session.module_symbols(self._module) else "none",
                                       self.timestamp(), self.checksum()))

    @export
    def getModulesList():
        return [module(m.base) for m in session.modules()]

    class typeInfo(_NumVariant):
        def __init__(self, name):
            self._desc = name if isinstance(name, _TypeDesc) else session.type_desc(_text(name))

        def _numeric_value(self):
            _unsupported("int(typeInfo)", "the numeric value of a type is not documented")

        def name(self):
            return self._desc.name

        def scopeName(self):
            return self._desc.module or ""

        def size(self):
            return self._desc.size

        def _field(self, name):
            desc = self._desc
            if desc.kind != "struct":
                raise TypeException("%s : type is not a struct" % desc.name)
            if isinstance(name, int):
                if not 0 <= name < len(desc.fields):
                    raise IndexError("Index out of range")
                return desc.fields[name][1], desc.fields[name][2]
            found = desc.field(name)
            if found is None:
                raise TypeException("'%s' type has no field '%s'" % (desc.name, name))
            return found

        def fieldOffset(self, name):
            if isinstance(name, int):
                return self._field(name)[0]
            total = 0
            current = self
            for part in _text(name).split("."):
                offset, desc = current._field(part)
                total += offset
                current = typeInfo(desc)
            return total

        def field(self, name):
            return typeInfo(self._field(name)[1])

        def hasField(self, name):
            return self._desc.kind == "struct" and self._desc.field(name) is not None

        def fieldName(self, index):
            self._field(index)
            return self._desc.fields[index][0]

        def getNumberFields(self):
            return len(self._desc.fields or ())

        def fields(self):
            return [(name, typeInfo(desc)) for name, _, desc in self._desc.fields or ()]

        def members(self):
            return self.fields()

        def __len__(self):
            return self.getNumberFields() if self._desc.kind == "struct" else self._desc.count

        def __contains__(self, name):
            return self.hasField(name)

        def __getattr__(self, name):
            if name.startswith("_"):
                raise AttributeError(name)
            if not self.hasField(name):
                raise AttributeError("'%s' type has no field '%s'" % (self._desc.name, name))
            return self.field(name)

        def __getitem__(self, key):
            if isinstance(key, str) and not self.hasField(key):
                raise KeyError("'%s' type has no field '%s'" % (self._desc.name, key))
            return self.field(key)

        def bitOffset(self):
            return self._desc.bit_position

        def bitWidth(self):
            return self._desc.bit_length

        def isBitField(self):
            return self._desc.kind == "bitfield"

        def deref(self):
            if self._desc.kind != "pointer":
                raise TypeException("%s : type is not a pointer" % self._desc.name)
            return typeInfo(self._desc.target)

        def ptrTo(self, ptrSize=0):
            return typeInfo(session.pointer_to(self._desc, ptrSize))

        def arrayOf(self, count):
            return typeInfo(session.array_of(self._desc, _count(count)))

        def isArray(self):
            return self._desc.kind == "array"

        def isPointer(self):
            return self._desc.kind == "pointer"

        def isVoid(self):
            return self._desc.kind == "void"

        def isBase(self):
            return self._desc.kind in ("base", "bitfield")

        def isUserDefined(self):
            return self._desc.kind == "struct"

        def isEnum(self):
            return self._desc.kind == "enum"

        def isFunction(self):
            return False

        def isConstant(self):
            return False

        def isTemplate(self):
            return False

        def isVtbl(self):
            return False

        def isNoType(self):
            return False

        def isStaticField(self, name):
            self._field(name)
            return False

        def isConstField(self, name):
            self._field(name)
            return False

        def getTypedVar(self, addrOrBytes):
            return typedVar(self, addrOrBytes)

        def __str__(self):
            desc = self._desc
            if desc.kind != "struct":
                return desc.name
            lines = ["struct : %s Size: 0x%x (%d)" % (desc.name, desc.size, desc.size)]
            lines.extend("   +%04x %s : %s" % (offset, name, field.name) for name, offset, field in desc.fields)
            return "\n".join(lines)

    class typedVar(_NumVariant):
        def __init__(self, *args):
            if len(args) == 1:
                address = session.get_offset(_text(args[0]))
                _unsupported("typedVar(%r)" % args[0], "ISF symbols carry no variable types; "
                             "use typedVar(typeName, 0x%x)" % address)
            if len(args) != 2:
                raise ArgumentError("Python argument types did not match C++ signature: typedVar")
            type_arg, location = args
            desc = type_arg._desc if isinstance(type_arg, typeInfo) else session.type_desc(_text(type_arg))
            self._init(desc, location)

        def _init(self, desc, location, byte_base=0):
            object.__setattr__(self, "_desc", desc)
            if isinstance(location, (int, _NumVariant)):
                object.__setattr__(self, "_address", session.addr64(_number(location)))
                object.__setattr__(self, "_bytes", None)
            else:
                object.__setattr__(self, "_address", byte_base)
                object.__setattr__(self, "_bytes", location)

        @classmethod
        def _at(cls, desc, address, source_bytes=None):
            var = cls.__new__(cls)
            var._init(desc, address if source_bytes is None else source_bytes,
                      byte_base=address if source_bytes is not None else 0)
            return var

        def _raw(self):
            desc = self._desc
            if self._bytes is not None:
                start = self._address
                return bytes(self._bytes[start:start + desc.size])
            session.calls["typedVar value"] += 1  # one engine read per value use
            return session.read_scalar(self._address, desc.size)

        def _numeric_value(self):
            desc = self._desc
            if desc.kind in ("struct", "array", "void"):
                return self._address
            value = session.decode(desc, self._raw())
            return int(value) if isinstance(value, float) else value

        def __float__(self):
            if self._desc.scalar == "float" and self._desc.kind == "base":
                return session.decode(self._desc, self._raw())
            return float(self._numeric_value())

        def getAddress(self):
            if self._bytes is not None:
                raise DbgException("python accessor error")
            return self._address

        def getLocation(self):
            return fake.Location.Memory, self.getAddress()

        def sizeof(self):
            return self._desc.size

        def type(self):
            return typeInfo(self._desc)

        def _struct(self):
            desc = self._desc
            if desc.kind == "pointer" and desc.target.kind == "struct":
                return self.deref()
            return self

        def _child(self, offset, desc):
            if self._bytes is not None:
                return typedVar._at(desc, self._address + offset, self._bytes)
            return typedVar._at(desc, self._address + offset)

        def field(self, name):
            base = self._struct()
            if base._desc.kind != "struct":
                raise TypeException("%s : type is not a struct" % base._desc.name)
            if isinstance(name, int):
                if not 0 <= name < len(base._desc.fields):
                    raise IndexError("Index out of range")
                _, offset, desc = base._desc.fields[name]
                return base._child(offset, desc)
            found = base._desc.field(name)
            if found is None:
                raise AttributeError("typed var has no field '%s'" % name)
            return base._child(found[0], found[1])

        def fieldOffset(self, name):
            return typeInfo(self._struct()._desc).fieldOffset(name)

        def hasField(self, name):
            desc = self._struct()._desc
            return desc.kind == "struct" and desc.field(name) is not None

        def getNumberFields(self):
            return len(self._struct()._desc.fields or ())

        def fieldName(self, index):
            return typeInfo(self._struct()._desc).fieldName(index)

        def fields(self):
            base = self._struct()
            return [(name, offset, base._child(offset, desc)) for name, offset, desc in base._desc.fields or ()]

        def members(self):
            return self.fields()

        def deref(self):
            desc = self._desc
            if desc.kind != "pointer":
                raise TypeException("%s : type is not a pointer" % desc.name)
            return typedVar._at(desc.target, session.decode(desc, self._raw()))

        def castTo(self, typeName):
            desc = typeName._desc if isinstance(typeName, typeInfo) else session.type_desc(_text(typeName))
            if self._bytes is not None:
                return typedVar._at(desc, self._address, self._bytes)
            return typedVar._at(desc, self._address)

        def rawBytes(self):
            return list(self._raw())

        def __getattr__(self, name):
            if name.startswith("_"):
                raise AttributeError(name)
            return self.field(name)

        def __setattr__(self, name, value):
            _session_changing("typedVar.%s = ..." % name)

        def __setitem__(self, key, value):
            _session_changing("typedVar[...] = ...")

        def setField(self, name, value):
            _session_changing("typedVar.setField")

        def __getitem__(self, key):
            desc = self._desc
            if isinstance(key, str):
                try:
                    return self.field(key)
                except AttributeError:
                    raise KeyError("typed var has no field '%s'" % key)
            if desc.kind == "array":
                return self._child(key * desc.target.size, desc.target)
            if desc.kind == "pointer":
                return typedVar._at(desc.target, session.decode(desc, self._raw()) + key * desc.target.size)
            return self.field(key)

        def __len__(self):
            desc = self._desc
            if desc.kind == "array":
                return desc.count
            if desc.kind == "struct":
                return len(desc.fields)
            raise TypeException("%s : type has no length" % desc.name)

        def __iter__(self):
            return iter([self[index] for index in range(len(self))])

        def __contains__(self, name):
            return self.hasField(name)

        def __dir__(self):
            desc = self._struct()._desc
            return [name for name, _, _ in desc.fields or ()]

        def __str__(self):
            desc = self._desc
            if desc.kind == "struct":
                lines = ["struct/class: %s at 0x%x" % (desc.name, self._address)]
                for name, offset, field in desc.fields:
                    lines.append("   +%04x %s : %s" % (offset, name, field.name))
                return "\n".join(lines)
            if desc.kind == "array":
                return "%s at 0x%x" % (desc.name, self._address)
            prefix = "Ptr " if desc.kind == "pointer" else ""
            try:
                value = self._numeric_value()
                shown = "0x%x (%d)" % (value, value)
            except MemoryException:
                shown = "????"
            return "%s%s at 0x%x Value: %s" % (prefix, desc.name, self._address, shown)

        def __hash__(self):
            return self._int()

    @export
    def typedVarList(headAddr, typeName, fieldName, /):
        head = session.addr64(_number(headAddr))
        info = typeName if isinstance(typeName, typeInfo) else typeInfo(_text(typeName))
        link_offset = info.fieldOffset(fieldName)
        field = info
        for part in _text(fieldName).split("."):
            field = field.field(part)
        # A pointer to the entry type itself is a singly linked "Next"; anything else
        # (a LIST_ENTRY, or its Flink reached by a dotted path) is a doubly linked list.
        singly_linked = field.isPointer() and field.deref().name() == info.name()
        if singly_linked:
            entries = session.follow_links("typedVarList", head, link_offset)
            return [typedVar._at(info._desc, entry) for entry in entries]
        entries = session.follow_links("typedVarList", head)
        return [typedVar._at(info._desc, entry - link_offset) for entry in entries]

    @export
    def typedVarArray(addr, typeName, count, /):
        info = typeName if isinstance(typeName, typeInfo) else typeInfo(_text(typeName))
        address = session.addr64(_number(addr))
        return [typedVar._at(info._desc, address + index * info.size()) for index in range(_count(count))]

    @export
    def containingRecord(addr, typeName, fieldName, /):
        info = typeName if isinstance(typeName, typeInfo) else typeInfo(_text(typeName))
        return typedVar._at(info._desc, session.addr64(_number(addr)) - info.fieldOffset(fieldName))

    class baseTypes(object):
        pass

    for _base_name in ("UInt1B", "UInt2B", "UInt4B", "UInt8B", "Int1B", "Int2B", "Int4B", "Int8B", "Long",
                       "ULong", "Bool", "Char", "WChar", "VoidPtr", "Float", "Double"):
        setattr(baseTypes, _base_name, typeInfo(_base_name))

    # ---- registers, threads, stack ----
    register_names = list(session.registers)

    def register_value(name):
        if isinstance(name, int):
            if not 0 <= name < len(register_names):
                raise DbgException("Call IDebugRegisters2::GetValue failed\nHRESULT 0x80070057")
            name = register_names[name]
        key = _text(name).lower()
        if key not in session.registers:
            raise DbgException("Call IDebugRegisters2::GetIndexByNameWide failed\nHRESULT 0x80070057")
        return session.registers[key]

    @export
    def reg(name, /):
        return register_value(name)

    @export
    def getNumberRegisters():
        return len(register_names)

    @export
    def getRegisterName(index, /):
        if not 0 <= index < len(register_names):
            raise DbgException("Call IDebugRegisters2::GetDescription failed\nHRESULT 0x80070057")
        return register_names[index]

    # getIP/getSP/getFP and cpu().ip/.sp/.fp: the architecture's registers.
    special = {"x64": {"ip": "rip", "sp": "rsp", "fp": "rbp"}, "x86": {"ip": "eip", "sp": "esp", "fp": "ebp"},
               "arm64": {"ip": "pc", "sp": "sp", "fp": "fp"}}[session.arch]

    def special_register(kind):
        return register_value(special[kind])

    @export
    def getIP():
        return special_register("ip")

    @export
    def getSP():
        return special_register("sp")

    @export
    def getFP():
        return special_register("fp")

    class cpu(object):
        def __init__(self):
            pass

        ip = property(lambda self: special_register("ip"))
        sp = property(lambda self: special_register("sp"))
        fp = property(lambda self: special_register("fp"))

        def getCPUType(self):
            return getCPUType()

        def getCPUMode(self):
            return getCPUMode()

        def __getattr__(self, name):
            if name.startswith("_"):
                raise AttributeError(name)
            return register_value(name)

        def __getitem__(self, index):
            if not 0 <= index < len(register_names):
                raise IndexError("Index out of range")
            return register_names[index], session.registers[register_names[index]]

        def __len__(self):
            return len(register_names)

    def current_thread():
        return session.threads[0] if session.threads else None

    def thread_data(thread):
        if thread is None:
            return 0
        return thread.kthread if session.mode == "kernel" else thread.teb

    @export
    def getCurrentThread():
        return thread_data(current_thread())

    @export
    def getImplicitThread():
        return thread_data(current_thread())

    @export
    def getCurrentThreadId():
        return 0

    @export
    def getNumberThreads():
        return max(len(session.threads), 1)

    @export
    def getThreadId(index, /):
        if not 0 <= index < getNumberThreads():
            raise DbgException("Call IDebugSystemObjects::GetThreadIdsByIndex failed\nHRESULT 0x80070057")
        return index

    def thread_by_id(thread_id):
        index = 0 if thread_id == -1 else thread_id
        if not session.threads or not 0 <= index < len(session.threads):
            raise DbgException("Call IDebugSystemObjects::GetThreadIdsByIndex failed\nHRESULT 0x80070057")
        return session.threads[index]

    @export
    def getThreadOffset(Id=-1):
        return thread_data(thread_by_id(Id))

    @export
    def getThreadSystemID(Id=-1):
        return thread_by_id(Id).thread_id

    @export
    def getProcessThreads():
        return [thread_data(thread) for thread in session.threads]

    @export
    def getCurrentProcess():
        return session.process

    @export
    def getImplicitProcess():
        return session.process

    @export
    def getCurrentProcessId():
        return 0

    @export
    def getNumberProcesses():
        return 1

    @export
    def getProcessId(index, /):
        if index != 0:
            raise DbgException("Call IDebugSystemObjects::GetProcessIdsByIndex failed\nHRESULT 0x80070057")
        return 0

    @export
    def getTargetProcesses():
        return [0]

    @export
    def getProcessOffset(Id=-1):
        return session.process

    @export
    def getProcessSystemID(Id=-1):
        return 4 if session.mode == "kernel" else 0x1000

    @export
    def getProcessExeName(Id=-1):
        user_modules = [m for m in session.modules() if m.image.lower().endswith(".exe")]
        return user_modules[0].image if user_modules else ""

    class stackFrame(object):
        def __init__(self, ip, ret, fp, sp):
            self.ip = self.instructionOffset = ip
            self.ret = self.returnOffset = ret
            self.fp = self.frameOffset = fp
            self.sp = self.stackOffset = sp

        def isInline(self):
            return False

        def findSymbol(self):
            return findSymbol(self.ip)

        def __str__(self):
            return "Frame: IP=%x  Return=%x  Frame Offset=%x  Stack Offset=%x" % (
                self.ip, self.ret, self.fp, self.sp)

    for _frame_member, _frame_reason in (("getParams", "no private symbols"), ("getParam", "no private symbols"),
                                         ("getLocals", "no private symbols"), ("getLocal", "no private symbols"),
                                         ("switchTo", "changes the debugger's scope"),
                                         ("getSourceLine", "no source line information")):
        setattr(stackFrame, _frame_member, _member_stub("stackFrame." + _frame_member, _frame_reason))
    stackFrame.params = property(lambda self: _unsupported("stackFrame.params", "no private symbols"))
    stackFrame.locals = property(lambda self: _unsupported("stackFrame.locals", "no private symbols"))

    @export
    def getStack(inlineFrames=False):
        if session.stack is not None:
            return [stackFrame(*frame) for frame in session.stack]
        try:
            return [stackFrame(getIP(), 0, getFP(), getSP())]
        except DbgException:
            return []

    @export
    def getFrame():
        frames = getStack()
        if not frames:
            raise DbgException("Call IDebugControl::GetStackTrace failed\nHRESULT 0x80004005")
        return frames[0]

    @export
    def getFrameNumber():
        return 0

    class targetThread(object):
        def __init__(self, index=0):
            self._thread = thread_by_id(index)
            self.id = index

        @staticmethod
        def getNumber():
            return getNumberThreads()

        @staticmethod
        def getCurrent():
            return targetThread(0)

        @staticmethod
        def getThreadById(thread_id):
            return targetThread(thread_id)

        systemID = property(lambda self: self._thread.thread_id)
        teb = property(lambda self: self._thread.teb)
        ip = instructionOffset = property(lambda self: self._register("ip"))
        sp = stackOffset = property(lambda self: self._register("sp"))
        fp = frameOffset = property(lambda self: self._register("fp"))

        def _register(self, kind):
            registers = self._thread.registers or session.registers
            return registers.get(special[kind], 0)

        def isCurrent(self):
            return self.id == 0

        def stack(self):
            return getStack() if self.id == 0 else []

        def setCurrent(self):
            _session_changing("targetThread.setCurrent")

        def __str__(self):
            return "Thread %d: system id %x" % (self.id, self.systemID)

    class targetProcess(object):
        def __init__(self, index=0):
            if index != 0:
                raise DbgException("Call IDebugSystemObjects::GetProcessIdsByIndex failed\nHRESULT 0x80070057")
            self.id = 0

        @staticmethod
        def getNumber():
            return 1

        @staticmethod
        def getCurrent():
            return targetProcess()

        @staticmethod
        def getProcessById(process_id):
            return targetProcess(process_id)

        systemID = property(lambda self: getProcessSystemID())
        peb = property(lambda self: session.process)
        exeName = property(lambda self: getProcessExeName())

        def isCurrent(self):
            return True

        def isManaged(self):
            return False

        def getNumberThreads(self):
            return getNumberThreads()

        def getThread(self, index):
            return targetThread(index)

        def getThreadById(self, thread_id):
            return targetThread(thread_id)

        def currentThread(self):
            return targetThread(0)

        def threads(self):
            return [targetThread(index) for index in range(len(session.threads))]

        def getNumberModules(self):
            return len(session.modules())

        def getModule(self, index):
            return module(session.modules()[index].base)

        def getModuleByOffset(self, address):
            return module(address)

        def getModuleByName(self, name):
            return module(name)

        def modules(self):
            return getModulesList()

        def getNumberBreakpoints(self):
            return 0

        def breakpoints(self):
            return []

        def setCurrent(self):
            _session_changing("targetProcess.setCurrent")

        def __str__(self):
            return "Process %d" % self.id

    class targetSystem(object):
        def __init__(self, index=0):
            self.id = index
            self.desc = "fake pykd target (%s %s)" % (session.mode, "dump" if session.dump else "live")

        @staticmethod
        def getNumber():
            return 1

        @staticmethod
        def getCurrent():
            return targetSystem()

        @staticmethod
        def getSystemById(system_id):
            return targetSystem(system_id)

        def isDumpAnalyzing(self):
            return isDumpAnalyzing()

        def isKernelDebugging(self):
            return isKernelDebugging()

        def is64bitSystem(self):
            return is64bitSystem()

        def isCurrent(self):
            return True

        def getNumberProcesses(self):
            return 1

        def getProcess(self, index):
            return targetProcess(index)

        def getProcessById(self, process_id):
            return targetProcess(process_id)

        def getProcessBySystemId(self, pid):
            return targetProcess()

        def currentProcess(self):
            return targetProcess()

        def processes(self):
            return [targetProcess()]

        def setCurrent(self):
            _session_changing("targetSystem.setCurrent")

        def __str__(self):
            return self.desc

    class breakpoint(object):
        def __init__(self, *args, **kwargs):
            _session_changing("breakpoint")

    class eventHandler(object):
        """Subclass and override on*; a read-only target raises no events."""

    class disasm(object):
        def __init__(self, *args):
            _unsupported("disasm", "the debugger's disassembler is not modelled; use capstone")

    # ---- assemble the module ----
    for name in SESSION_CHANGING:
        api[name] = _function_stub(name, session, lambda name=name: _session_changing(name))
    for name, reason in UNSUPPORTED.items():
        api[name] = _function_stub(name, session, lambda name=name, reason=reason: _unsupported(name, reason))
    for class_name, members in OMITTED_MEMBERS.items():
        owner = {"module": module, "typeInfo": typeInfo, "typedVar": typedVar}[class_name]
        for member, reason in members.items():
            if member not in owner.__dict__:
                setattr(owner, member, _member_stub("%s.%s" % (class_name, member), reason))

    classes = {
        "numVariant": _NumVariant, "module": module, "typeInfo": typeInfo, "typedVar": typedVar,
        "baseTypes": baseTypes, "cpu": cpu, "stackFrame": stackFrame, "systemVersion": systemVersion,
        "targetSystem": targetSystem, "targetProcess": targetProcess, "targetThread": targetThread,
        "breakpoint": breakpoint, "eventHandler": eventHandler, "disasm": disasm,
    }
    for name in ("dout", "din", "typedVarIterator", "typeInfoProviderIterator", "symbolIterator",
                 "targetHeapIterator", "targetHeap", "FixedFileInfo", "exceptionInfo", "debugEvent",
                 "syntheticSymbol", "typeInfoProvider", "symbolProvider"):
        classes[name] = _not_constructible(name)
    for cls_name, cls in classes.items():
        cls.__name__ = cls_name
        cls.__module__ = "pykd"

    namespace = fake.__dict__
    namespace.update(api)
    namespace.update(classes)
    namespace.update({name: _make_enum(name, members) for name, members in ENUMS.items()})
    namespace.update({
        "DbgException": DbgException, "MemoryException": MemoryException,
        "SymbolException": SymbolException, "TypeException": TypeException,
        "CallException": CallException, "CPUException": CPUException,
        "__version__": VERSION, "version": VERSION,
        "fake_calls": session.calls, "fake_commands": session.commands, "fake_session": session,
    })
    return fake


def _function_stub(name, session, action):
    def stub(*args, **kwargs):
        session.calls[name] += 1
        action()
    stub.__name__ = name
    return stub


def _member_stub(qualified_name, reason):
    changes = reason in ("writes target memory", "calls target code", "changes the debugger session",
                         "changes the debugger's scope")

    def stub(self, *args, **kwargs):
        if changes:
            _session_changing(qualified_name)
        _unsupported(qualified_name, reason)
    return stub


class _SessionSymbols(object):
    """The slice of the SymbolTable interface ``dbgext.basic.address.evaluate`` needs."""

    def __init__(self, session):
        self._session = session

    def address(self, name):
        try:
            return self._session.get_offset(name)
        except DbgException:
            return None

    def module_base(self, name):
        module = self._session.module_named(name)
        return module.base if module else None
