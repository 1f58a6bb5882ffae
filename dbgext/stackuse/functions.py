"""Function discovery and per-function frame sizes, reconciled from two sources.

Functions come from ``.pdata`` (x64, ARM64), exports, debugger symbols, the entry point,
and — through :mod:`callgraph` — the targets of direct calls (leaf functions have
no ``.pdata`` entry; x86 has no ``.pdata`` at all).  Each function's frame size is
taken from the unwind data when there is some (it is exact) and from the prologue
scan otherwise; when both exist they are compared and any disagreement is kept.
"""

import bisect

from ..disasm import direct_target, parse_int
from ..stacks.arm64_unwind import INSTRUCTION_SIZE, PDATA_CHAINED, function_unwind
from ..stacks.images import runtime_functions
from ..stacks.unwind_data import UNW_FLAG_CHAININFO, frame_from_unwind
from ..stacks.x64 import UnwindError
from . import arm64_prologue
from .layouts import FRAME_HELPER_EPILOGS, FRAME_HELPERS, HELPER_CODE
from .prologue import STACK_PROBE_NAMES, Decoder, is_named, scan_prologue

MAX_JUMP_TABLE = 4096
# Epilogs first: "SEH_epilog4" must not match a prolog's fragment.
HELPER_NAMES = ((("probe", STACK_PROBE_NAMES), ("epilog", FRAME_HELPER_EPILOGS))
                + tuple(("frame " + fragment, (fragment,)) for fragment, _, _ in FRAME_HELPERS))


PADDING_MNEMONICS = frozenset(["int3", "nop", "xchg"])


def _is_padding(insn):
    """Fill between functions: int3, (multi-byte) nops, zero bytes (``add [eax],
    al``) and the do-nothing ``lea esi, [esi + eiz]`` / ``mov edi, edi``-free
    forms gcc pads with."""
    mnemonic, op_str = insn[2], insn[3]
    if mnemonic in PADDING_MNEMONICS:
        return mnemonic != "xchg" or op_str == "ax, ax"
    if mnemonic == "add" and op_str == "byte ptr [eax], al":
        return True
    if mnemonic == "lea":
        register, _, source = op_str.partition(", ")
        inner = source[source.find("[") + 1:source.rfind("]")]
        return inner in (register, register + " + eiz", register + " + eiz*1", register + " + 0")
    return False


class FunctionInfo(object):
    """What is known about one function (addresses are VAs)."""

    __slots__ = ("module", "va", "rva", "name", "origin", "end", "fragment_of", "unwind_size",
                 "prologue_size", "dynamic", "problem", "analysed_body",
                 "body_problem", "ret_pop", "max_depth", "call_sites", "sp_lost", "body_end", "moves_sp", "padding",
                 "prolog_end", "thunk_of")

    def __init__(self, module, va, rva, origin, name=None, end=None):
        self.module = module
        self.va = va
        self.rva = rva
        self.name = name
        # which source found it: "pdata", "export", "symbol" (ISF/PDB), "coff", "entry",
        # "seh-handler", "cfg-target", "relocation", "call", "import", "address-taken",
        # "request"
        self.origin = origin
        self.end = end              # VA after the last byte (from .pdata) or None
        self.fragment_of = None     # VA of the primary function for a chained fragment
        self.unwind_size = None
        self.prologue_size = None
        self.dynamic = None         # text of the instruction making the frame dynamic
        self.problem = None         # why no frame size could be determined
        self.analysed_body = False
        self.body_problem = None    # first problem met while following the body
        self.ret_pop = 0            # bytes `ret N` pops (x86 stdcall)
        self.max_depth = 0          # deepest SP (below the return address) in the body
        self.call_sites = []        # callgraph.CallSite
        self.sp_lost = None         # instruction after which SP could not be tracked
        self.body_end = None        # VA after the last instruction followed
        self.moves_sp = False       # returns with SP elsewhere than it found it (__chkstk)
        # Realignment (`and esp, -16`) may add up to this many bytes on top of the
        # frame; compilers leave them out of the frame size, worst-case depths count them.
        self.padding = 0
        self.prolog_end = None      # x64, ARM64: VA after the prologue the unwind data describes
        self.thunk_of = None        # the import its first instruction jumps to (`jmp [IAT slot]`)

    @property
    def source(self):
        if self.unwind_size is not None and self.prologue_size is not None \
                and self.unwind_size == self.prologue_size:
            return "both"
        if self.unwind_size is not None:
            return "unwind"
        return "prologue"

    @property
    def frame_size(self):
        """Bytes the function moves SP below its return address; None when dynamic
        or undecodable."""
        if self.dynamic:
            return None
        if self.unwind_size is not None:
            return self.unwind_size
        return self.prologue_size

    @property
    def disagreement(self):
        if self.unwind_size is None or self.prologue_size is None or self.unwind_size == self.prologue_size:
            if self.dynamic and self.unwind_size is not None:
                return "dynamic frame (%s) beyond the %d static bytes in the unwind data" % (
                    self.dynamic, self.unwind_size)
            return None
        return "prologue scan found %d bytes, unwind data says %d" % (self.prologue_size, self.unwind_size)

    @property
    def display_name(self):
        return self.name or "%s+0x%x" % (self.module.name, self.rva)


class ModuleFunctions(object):
    """The functions of one image and the decoder over its code."""

    def __init__(self, image, symbols=None):
        """``symbols``: {rva: name} from the debugger, an ISF file or a PDB, or None."""
        self.image = image
        self.name = image.name
        self.arch = image.arch
        self.pointer_size = image.pointer_size
        # What a call pushes: ARM64's bl leaves the return address in lr.
        self.return_address_size = 0 if image.arch == "arm64" else image.pointer_size
        self.decoder = Decoder(image)
        self.functions = {}           # va -> FunctionInfo
        self.problems = image.problems  # one log per image: its directories are parsed lazily
        self.names = {}               # va -> name (exports and symbols)
        self._unwind_cache = {}
        self._relocations = None
        self._helpers_by_code = {}
        self._jump_table_sites = set()  # RVAs of relocated pointers that are jump-table entries
        self._jump_table_targets = set()  # VAs those entries point at (case labels)
        self._starts = None
        self._fragments = None
        self._seed(symbols or {})

    # -- discovery --------------------------------------------------------------------

    def _seed(self, symbols):
        """Functions named or pointed at by the image and the given symbols, each
        recorded with the source that found it (``origin``)."""
        image = self.image
        base = image.image_base
        named = [("export", image.exports),
                 ("symbol", symbols),
                 ("coff", image.coff_functions)]
        for _, table in named:
            for rva, name in table.items():
                if image.is_code(rva):
                    self.names.setdefault(base + rva, name)
        for slot_rva, name in image.imports.items():
            self.names.setdefault(base + slot_rva, name)
        if image.arch == "x64":
            self._seed_pdata()
        elif image.arch == "arm64":
            self._seed_arm64_pdata()
        for origin, table in named:
            for rva in table:
                self.add(base + rva, origin)
        if image.entry_point:
            self.add(base + image.entry_point, "entry")
        for origin, rvas in (("seh-handler", image.seh_handlers), ("cfg-target", image.guard_functions)):
            for rva in rvas:
                self.add(base + rva, origin)

    def _seed_pdata(self):
        image = self.image
        base = image.image_base
        # {UNWIND_INFO bytes: (frame size, prologue size)} of unchained records that
        # parsed cleanly: most functions share their prologue's few shapes, and
        # the same bytes always parse the same.
        plain_frames = {}
        for index, entry in enumerate(runtime_functions(image)):
            begin, end, unwind_rva = entry
            if begin == 0 and end == 0:
                continue
            function = self._pdata_function(index, begin, end, "RUNTIME_FUNCTION")
            if function is None:
                continue
            record = self._plain_unwind_record(unwind_rva)
            known = plain_frames.get(record) if record is not None else None
            if known is not None:
                function.unwind_size, prolog_size = known
                function.prolog_end = base + begin + prolog_size
                continue
            frame = frame_from_unwind(image, entry, self._unwind_cache)
            function.unwind_size = frame.frame_size
            info = self._unwind_cache.get(unwind_rva)
            function.prolog_end = base + begin + (info.prolog_size if info is not None else 0)
            if record is not None and frame.frame_size is not None and not frame.problem and info is not None:
                plain_frames[record] = (frame.frame_size, info.prolog_size)
            if frame.problem:
                function.problem = frame.problem
                self.problems.add("bad_unwind_info", base + begin, frame.problem)
            if frame.is_fragment:
                function.fragment_of = base + frame.chain[-1][0]
        self._starts = None

    def _pdata_function(self, index, begin, end, what):
        """The function ``.pdata`` entry ``index`` starts (made on first sight), or
        None, reported, when the entry lies outside the image's code."""
        image = self.image
        base = image.image_base
        if not (0 < begin < end <= image.size_of_image) or not image.is_code(begin):
            self.problems.add("pdata_entry_outside_code", base + begin, "%s #%d [0x%x, 0x%x) lies outside the "
                              "code of %s" % (what, index, begin, end, image.name))
            return None
        function = self.functions.get(base + begin)
        if function is None:
            function = FunctionInfo(self, base + begin, begin, "pdata", end=base + end)
            self.functions[base + begin] = function
        return function

    def _seed_arm64_pdata(self):
        """ARM64 ``.pdata``: each entry's frame is what its prologue's unwind codes
        allocate (packed entries expanded to their codes), its prologue ends
        after the instructions those codes stand for; a chained entry is a
        fragment of the function whose entry it points at."""
        image = self.image
        base = image.image_base
        for index, entry in enumerate(runtime_functions(image)):
            begin, end, word = entry
            function = self._pdata_function(index, begin, end, ".pdata entry")
            if function is None:
                continue
            try:
                unwind = function_unwind(image, entry)
            except UnwindError as error:
                function.problem = str(error)
                self.problems.add("bad_unwind_info", base + begin, str(error))
                continue
            function.unwind_size = unwind.frame_size
            if word & 3 == PDATA_CHAINED:
                function.fragment_of = base + unwind.begin
                function.prolog_end = function.va
            else:
                function.prolog_end = base + begin + INSTRUCTION_SIZE * unwind.prologue_size
        self._starts = None

    def _plain_unwind_record(self, rva):
        """The bytes of the UNWIND_INFO at ``rva`` (header and codes) when they are
        readable and it is not chained to a parent entry, else None."""
        if not 0 < rva < self.image.size_of_image:
            return None
        # One read covers the largest record (255 code slots).
        data = self.image.read_partial(rva, 4 + 2 * 255)
        if len(data) < 4 or data[0] >> 3 & UNW_FLAG_CHAININFO or len(data) < 4 + 2 * data[2]:
            return None
        return data[:4 + 2 * data[2]]

    def add(self, va, origin):
        """Make sure a function starts at ``va``; returns its FunctionInfo (or None
        when ``va`` is not in this image's code)."""
        function = self.functions.get(va)
        if function is not None:
            if function.name is None:
                function.name = self.names.get(va)
            return function
        rva = va - self.image.image_base
        if not self.image.is_code(rva):
            return None
        function = FunctionInfo(self, va, rva, origin, name=self.names.get(va))
        self.functions[va] = function
        self._starts = None
        return function

    def jump_table(self, function, op_str, size=None):
        """Targets of an x86 ``jmp [reg*4 + table]`` in ``function``: ``size``
        entries when the code bounds the index, else the run of relocated pointers
        from ``table`` into the function (up to the next known function)."""
        image = self.image
        starts = self.starts()
        following = bisect.bisect_right(starts, function.va)
        # Pointers into code are taken for functions together, before their bodies
        # are followed: one not yet followed may be this table's own case label.
        while following < len(starts) and self.functions[starts[following]].origin == "relocation" \
                and not self.functions[starts[following]].analysed_body:
            following += 1
        limit = starts[following] if following < len(starts) else image.image_base + image.size_of_image
        table = parse_int(op_str.rsplit("+ ", 1)[1].rstrip("]"))
        if table is None:
            return []
        sites = self._relocation_sites()
        rva = table - image.image_base
        targets = []
        while rva in sites and len(targets) < (size or MAX_JUMP_TABLE):
            value = image.pointer(rva)
            if value is None or not function.va <= value < limit:
                break
            targets.append(value)
            self._jump_table_sites.add(rva)
            self._jump_table_targets.add(value)
            rva += self.pointer_size
        return targets

    def _relocation_sites(self):
        if self._relocations is None:
            self._relocations = frozenset(self.image.relocations)
        return self._relocations

    def add_code_pointers(self):
        """Add the functions that only pointers reach (callbacks, dispatch routines,
        vtables): relocated pointers into code that are neither jump-table entries
        nor inside a followed body.  Returns how many were added."""
        image = self.image
        base = image.image_base
        starts = list(self.starts())
        added = 0
        for rva in image.relocations:
            if rva in self._jump_table_sites:
                continue
            value = image.pointer(rva)
            if value is None or value in self.functions or not image.is_code(value - base):
                continue
            index = bisect.bisect_right(starts, value) - 1
            if index >= 0:
                containing = self.functions[starts[index]]
                if containing.body_end is not None and value < containing.body_end:
                    continue
            if self.add(value, "relocation") is not None:
                added += 1
        return added

    def drop_label(self, function):
        """A function found only by a relocated pointer that a followed body's jump
        table reaches is a case label of that body, not a function: it is dropped.
        Returns True when ``function`` was."""
        if function.origin != "relocation" or function.analysed_body or \
                function.va not in self._jump_table_targets:
            return False
        del self.functions[function.va]
        self._starts = None
        return True

    def skip_padding(self, va, limit):
        """The first address in [va, limit) that is neither alignment padding (int3,
        nops, zero fill, ``lea esi, [esi]``-style fillers) nor a relocated pointer
        (a table in the code), or None."""
        sites = self._relocation_sites()
        base = self.image.image_base
        while va < limit:
            if va - base in sites:
                va += self.pointer_size
                continue
            insn = self.decoder.at(va)
            if insn is None:
                return None
            if not _is_padding(insn):
                return va
            va += insn[1]
        return None

    def callee_kind(self, va):
        """What a call to ``va`` does to the caller's stack (see
        :func:`prologue.helper_call_effect`): "probe", "frame <name>", "epilog", "call"
        for an ordinary function already followed, None when nothing is known.  A
        ``jmp rel32`` thunk (an incremental-link table entry) is what it jumps to."""
        va = self._through_thunk(va)
        name = self.names.get(va)
        if name is not None:
            for kind, fragments in HELPER_NAMES:
                if is_named(name, fragments):
                    return kind
        if self.arch == "x86":
            kind = self._helper_by_code(va)
            if kind is not None:
                return kind
        function = self.functions.get(va)
        if function is None or function.body_end is None:
            return None
        return "probe" if function.moves_sp else "call"

    def _helper_by_code(self, va):
        """An MSVC frame helper recognised by its first instructions (cached)."""
        if va not in self._helpers_by_code:
            kind = None
            instructions = []
            address = va
            for _ in range(max(len(pattern) for _, pattern in HELPER_CODE)):
                insn = self.decoder.at(address)
                if insn is None:
                    break
                instructions.append(("%s %s" % (insn[2], insn[3])).rstrip())
                address += insn[1]
            for candidate, pattern in HELPER_CODE:
                if len(instructions) >= len(pattern) and all(
                        text == wanted or (wanted.endswith("*") and text.startswith(wanted[:-1]))
                        for text, wanted in zip(instructions, pattern)):
                    kind = candidate
                    break
            self._helpers_by_code[va] = kind
        return self._helpers_by_code[va]

    def pops_of(self, va):
        """Bytes the function at ``va`` pops on return (``ret N``), once followed."""
        function = self.functions.get(self._through_thunk(va))
        return function.ret_pop if function is not None and function.body_end is not None else None

    def _through_thunk(self, va):
        """x86: where a ``jmp rel32`` thunk at ``va`` (an incremental-link table
        entry) leads; else ``va``."""
        if self.arch != "x86":
            return va
        thunk = self.decoder.at(va)
        target = direct_target(thunk[3]) if thunk is not None and thunk[2] == "jmp" else None
        return target if target is not None else va

    def contains(self, va):
        return 0 <= va - self.image.image_base < self.image.size_of_image

    def fragments_of(self, va):
        """[(start, end)] of the chained fragments whose primary function is ``va``."""
        if self._fragments is None:
            self._fragments = {}
            for function in self.functions.values():
                if function.fragment_of is not None and function.end is not None:
                    self._fragments.setdefault(function.fragment_of, []).append((function.va, function.end))
        return self._fragments.get(va, ())

    def starts(self):
        if self._starts is None:
            self._starts = sorted(self.functions)
        return self._starts

    def function_containing(self, va):
        """The function starting closest at or below ``va`` that may contain it
        (within its .pdata range when it has one), or None."""
        starts = self.starts()
        index = bisect.bisect_right(starts, va) - 1
        if index < 0:
            return None
        function = self.functions[starts[index]]
        if function.end is not None and va >= function.end:
            return None
        return function

    def find_by_name(self, name):
        wanted = name.lower()
        for va, known in self.names.items():
            if known.lower() == wanted:
                return self.add(va, "request")
        return None

    # -- frames -----------------------------------------------------------------------

    def compute_frame(self, function):
        if function.prologue_size is not None or function.fragment_of is not None:
            return
        # A fragment's code runs inside its parent's frame: scanning it finds 0 by
        # design, so fragments take the chain's size only.
        if self.arch == "arm64":
            end = min(function.end or function.va + arm64_prologue.PROLOGUE_WINDOW,
                      function.va + arm64_prologue.PROLOGUE_WINDOW)
            result = arm64_prologue.scan_prologue(self.image.read_partial(function.rva, end - function.va),
                                                  function.va, self.decoder.disassembler)
        else:
            result = scan_prologue(self.decoder, function.va, self)
        if result.dynamic:
            function.dynamic = result.dynamic
        function.padding = result.padding
        if result.frame_size is not None:
            function.prologue_size = result.frame_size
        elif function.unwind_size is None and function.problem is None:
            function.problem = result.problem or "no prologue could be decoded"
