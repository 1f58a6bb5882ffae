"""What ``ln``, ``x`` and ``dt`` show, as results (rendering is in
:mod:`dbgext.symbols.command`): every fact is computed here, from the target's
symbol table (PDB, ISF, exports or the debugger)."""

import bisect
import fnmatch
import struct

from ..errors import BadInput, SymbolNotFound
from ..pe import DIRECTORY_EXPORT
from ..problems import ProblemLog
from .match import image_headers
from .module import EXPORT_SYMBOLS, ISF_SYMBOLS, PDB_SYMBOLS

SCHEMA_VERSION = 1

MAX_DT_BYTES = 0x10000   # the most one dt reads: a structure claiming more is shown as far as this
MAX_DT_DEPTH = 9         # WinDbg's -r takes a digit
MAX_DT_LINES = 20000
MAX_X_RESULTS = 100000
EXPORT_DIRECTORY_BYTES = 0x28   # IMAGE_EXPORT_DIRECTORY


class SymbolHit(object):
    __slots__ = ("module", "name", "address", "size")

    def __init__(self, module, name, address, size=None):
        self.module = module
        self.name = name
        self.address = address
        self.size = size

    @property
    def full_name(self):
        return "%s!%s" % (self.module, self.name)

    def as_dict(self):
        return {"module": self.module, "name": self.name, "address": self.address, "size": self.size}


def _hits_at(table, module, rva):
    """Every name of ``module`` at ``rva`` (aliases included), the procedure's first."""
    rvas, _ = table.sorted_symbols()
    entries = table.entries()
    return [SymbolHit(module.name, entry.name, module.base + rva, entry.size)
            for entry in entries[bisect.bisect_left(rvas, rva):bisect.bisect_right(rvas, rva)]]


class NearestResult(object):
    """``ln``: the symbols at or before an address and the next ones after it."""

    def __init__(self, address, module, status, before, after):
        self.address = address
        self.module = module
        self.status = status
        self.before = before
        self.after = after
        self.problems = ProblemLog()

    @property
    def exact(self):
        return [hit for hit in self.before if hit.address == self.address]

    def displacement(self, hit):
        return self.address - hit.address

    def as_dict(self):
        return {"schema_version": SCHEMA_VERSION, "command": "ln", "address": self.address, "module": self.module,
                "symbols": self.status,
                "before": [dict(hit.as_dict(), displacement=self.displacement(hit)) for hit in self.before],
                "after": [hit.as_dict() for hit in self.after],
                "exact": [hit.full_name for hit in self.exact],
                "problems": self.problems.as_list()}


def nearest_symbols(target, address):
    symbols = target.symbols
    module = target.module_at(address)
    if module is None:
        return NearestResult(address, None, None, [], [])
    table = symbols.module_symbols(module.name)
    status = symbols.status(module.name)
    if table is None or not table.symbols:
        return NearestResult(address, module.name, status, [], [])
    rvas, _ = table.sorted_symbols()
    rva = address - module.base
    following = bisect.bisect_right(rvas, rva)
    before = _hits_at(table, module, rvas[following - 1]) if following > 0 else []
    after = _hits_at(table, module, rvas[following]) if following < len(rvas) else []
    return NearestResult(address, module.name, status, before, after)


class MatchResult(object):
    """``x``: symbols whose ``module!name`` matches a pattern, by address."""

    def __init__(self, pattern, hits, without_symbols, truncated):
        self.pattern = pattern
        self.hits = hits
        self.without_symbols = without_symbols    # [(module name, why it has no symbols)]
        self.truncated = truncated
        self.problems = ProblemLog()

    @property
    def modules_without_symbols(self):
        return [name for name, _ in self.without_symbols]

    def as_dict(self):
        return {"schema_version": SCHEMA_VERSION, "command": "x", "pattern": self.pattern, "count": len(self.hits),
                "truncated": self.truncated, "symbols": [hit.as_dict() for hit in self.hits],
                "modules_without_symbols": self.modules_without_symbols,
                "why_no_symbols": dict(self.without_symbols), "problems": self.problems.as_list()}


def match_symbols(target, pattern, limit=MAX_X_RESULTS):
    """``MODULE!PATTERN`` with WinDbg's wildcards (``*``, ``?``), case-insensitive."""
    if "!" not in pattern:
        raise BadInput("x takes MODULE!PATTERN (e.g. nt!Ke*), not '%s'" % pattern)
    module_pattern, name_pattern = pattern.split("!", 1)
    module_pattern, name_pattern = module_pattern.lower(), (name_pattern or "*").lower()
    modules = [module for module in target.modules() if fnmatch.fnmatchcase(module.name.lower(), module_pattern)]
    if not modules:
        raise BadInput("x %s: no loaded module matches '%s'" % (pattern, module_pattern))
    hits, without = [], []
    truncated = False
    for module in modules:
        table = target.symbols.module_symbols(module.name)
        if table is None or not table.symbols:
            without.append((module.name, why_no_symbols(target, module, table)))
            continue
        for entry in table.entries():
            if fnmatch.fnmatchcase(entry.name.lower(), name_pattern):
                if len(hits) >= limit:
                    truncated = True
                    break
                hits.append(SymbolHit(module.name, entry.name, module.base + entry.rva, entry.size))
    hits.sort(key=lambda hit: (hit.address, hit.name))
    return MatchResult(pattern, hits, without, truncated)


def why_no_symbols(target, module, table):
    """Why ``module`` (``table``: its ModuleSymbols or None) has no symbols to
    list, in one phrase: what the target lacks and what the symbol path lacks —
    a small dump holds few image pages, so its modules have neither PDB nor
    exports until a symbol path gives the PDB."""
    if table is not None and table.status != EXPORT_SYMBOLS:
        return "its %s (%s) hold no symbols" % (table.status, table.path or table.source)
    kind = target.kind
    if kind == "pykd":
        return "the debugger has no symbols for it (see .sympath and .reload)"
    where = "the dump" if kind not in ("memory", "image") else "memory"
    headers = image_headers(target, module)
    if headers is None:
        image = "its image is not in %s" % where
    else:
        rva, size = headers.directory(DIRECTORY_EXPORT)
        directory = module.base + rva
        if not rva or not size:
            image = "its image has no exports"
        elif not target.try_read(directory, EXPORT_DIRECTORY_BYTES).readable(directory, EXPORT_DIRECTORY_BYTES):
            image = "its export table is not in %s" % where
        else:
            image = "its export table names nothing readable"
    locator = target.symbols.locator
    if locator is None or not locator.elements:
        return "%s and no symbol path is set (--symbols or _NT_SYMBOL_PATH)" % image
    return "%s and the symbol path gives no PDB for it" % image


# -- dt -------------------------------------------------------------------------------------

class DtLine(object):
    """One ``+0x028 InitialStack : Ptr64 Void`` line; ``value`` is the text shown
    after the colon when an address was given; ``children`` the nested lines (-r)."""

    __slots__ = ("offset", "name", "type_text", "value", "raw", "symbol", "children")

    def __init__(self, offset, name, type_text, value=None, raw=None, children=None):
        self.offset = offset
        self.name = name
        self.type_text = type_text
        self.value = value
        self.raw = raw
        self.symbol = None  # what a pointer value points into (module!name+0xoff)
        self.children = children or []

    def as_dict(self):
        return {"offset": self.offset, "name": self.name, "type": self.type_text, "value": self.raw,
                "display": self.value, "symbol": self.symbol, "members": [child.as_dict() for child in self.children]}


class TypeResult(object):
    def __init__(self, type_name, size, source, address, lines, type_names=None, enumerators=()):
        self.type_name = type_name
        self.enumerators = list(enumerators)  # an enum's (name, value) pairs
        self.size = size
        self.source = source
        self.address = address
        self.lines = lines
        self.type_names = type_names  # a wildcard's matching type names (then no lines)
        self.problems = ProblemLog()

    def as_dict(self):
        document = {"schema_version": SCHEMA_VERSION, "command": "dt", "type": self.type_name, "size": self.size,
                    "source": self.source, "address": self.address,
                    "members": [line.as_dict() for line in self.lines], "problems": self.problems.as_list()}
        if self.type_names is not None:
            document["matches"] = self.type_names
        if self.enumerators:
            document["enumerators"] = [{"name": name, "value": value} for name, value in self.enumerators]
        return document


def display_type(target, type_name, address=None, depth=0):
    """``dt [MODULE!]TYPE [ADDRESS]`` with ``depth`` levels of nested types (-r)."""
    symbols = target.symbols
    if "*" in type_name or "?" in type_name:
        return TypeResult(type_name, None, None, None, [], _matching_types(target, type_name))
    table, bare = symbols.type_owner(type_name)
    view = table.type_view(bare) if table is not None else None
    if view is None and address is None:
        # dt MODULE!variable: the variable's structure type at the variable's address.
        table, view, address = _variable(target, type_name)
    if view is None:
        raise SymbolNotFound("dt: no type information for '%s' (%s)" % (type_name, _type_sources(target)))
    data = None
    result = TypeResult(type_name, view.size, table.source, address, [], enumerators=view.enumerators)
    if address is not None:
        size = min(view.size or 0, MAX_DT_BYTES)
        data = target.try_read(address, size)
        for start, end in data.holes:
            result.problems.add("memory_unreadable", start, "0x%x bytes of %s are unreadable" % (end - start,
                                                                                                 view.name))
        if view.size and view.size > MAX_DT_BYTES:
            result.problems.add("type_truncated", address, "%s claims 0x%x bytes; dt shows the first 0x%x"
                                % (view.name, view.size, MAX_DT_BYTES), "warning")
    budget = [MAX_DT_LINES]
    result.lines = _lines(target, table, view, data, address, 0, min(depth, MAX_DT_DEPTH), budget, set())
    if budget[0] <= 0:
        result.problems.add("dt_truncated", address, "more than %d lines; the rest is left out" % MAX_DT_LINES,
                            "warning")
    return result


def _lines(target, table, view, data, base, offset, depth, budget, open_types):
    lines = []
    for member in view.members:
        if budget[0] <= 0:
            break
        budget[0] -= 1
        line = DtLine(member.offset, member.name, member.text)
        at = offset + member.offset
        if data is not None:
            line.raw, line.value = _value(target, member, data, base + at)
            if member.is_pointer and line.raw is not None and target.module_at(line.raw) is not None:
                line.symbol = target.symbolize(line.raw)
        if member.nested is not None and depth > 0 and member.nested not in open_types:
            nested = table.type_view(member.nested)
            if nested is not None:
                line.children = _lines(target, table, nested, data, base, at, depth - 1, budget,
                                       open_types | {member.nested})
        lines.append(line)
    return lines


def _value(target, member, data, address):
    """(raw value for JSON, text for the line) of one member read from ``data``."""
    size = member.size or 0
    if member.nested is not None:
        return None, None
    if not size or not data.readable(address, size):
        return None, "??"
    chunk = data.data[address - data.address:address - data.address + size]
    if member.bits is not None:
        position, length = member.bits
        value = (int.from_bytes(chunk, "little") >> position) & ((1 << length) - 1)
        return value, "0y" + format(value, "0%db" % length)
    if member.fmt is None:
        return None, None
    fmt = "<" + member.fmt.replace("P", "Q" if target.pointer_size == 8 else "I")
    if struct.calcsize(fmt) != len(chunk):
        return None, None
    values = struct.unpack(fmt, chunk)
    if len(values) > 1:
        if member.fmt.endswith(("b", "B")):
            text = bytes(value & 0xFF for value in values).split(b"\0", 1)[0].decode("latin-1")
            return list(values), '"%s"' % text
        return list(values), None
    value = values[0]
    if member.is_pointer:
        return value, "0x" + target.format_address(value)
    if member.enumerators is not None:
        label = member.enumerators.get(value)
        return value, "%s (0n%d)" % (label, value) if label else "0n%d" % value
    if isinstance(value, float):
        return value, repr(value)
    return value, "0n%d" % value if value < 0 else "0x%x" % value


def _variable(target, name):
    """(table, TypeView, address) of a global variable of structure type, or Nones."""
    if "!" not in name:
        return None, None, None
    module_name, variable = name.split("!", 1)
    module = target.module_named(module_name)
    table = target.symbols.module_symbols(module_name) if module is not None else None
    key = table.variable_type(variable) if table is not None else None
    view = table.type_view(key) if key is not None else None
    if view is None:
        return None, None, None
    return table, view, module.base + table.symbols[variable]


def _matching_types(target, pattern):
    module_name, bare = pattern.split("!", 1) if "!" in pattern else (None, pattern)
    names = []
    for module in target.modules():
        if module_name is not None and not fnmatch.fnmatchcase(module.name.lower(), module_name.lower()):
            continue
        table = target.symbols.module_symbols(module.name)
        if table is None:
            continue
        names.extend("%s!%s" % (module.name, name) for name in table.type_names()
                     if fnmatch.fnmatchcase(name.lower(), bare.lower()))
    return names


def _type_sources(target):
    sources = []
    for module in target.modules():
        status = target.symbols.status(module.name)
        if status in (PDB_SYMBOLS, ISF_SYMBOLS):
            sources.append("%s: %s" % (module.name, status))
    return "types known from " + ", ".join(sources) if sources else "no module has PDB or ISF types"
