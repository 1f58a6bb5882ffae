"""Call graph with stack-pointer tracking at every call site, and worst-case depth.

Each function body is followed from its entry (conditional branches, jumps inside
the function, chained fragments) with the stack depth below the return address
tracked per instruction.  The depth at a call site — not the frame size — is what
a call adds: x86 code pushes arguments right before calls, so summing frame sizes
undercounts.  Direct ``jmp`` to another function is a tail call (it reuses the
caller's return address); ``call/jmp [IAT slot]`` goes through an import, resolved
into the other loaded module when the image came from target memory.

ARM64 code moves sp only in prologues, epilogues and dynamic allocations, and
``bl`` pushes nothing: a call is made at the full frame depth, so an ARM64 body
is one linear pass (:func:`_sweep_arm64`), like an x64 body with unwind data.

Everything is iterative (WinDbg's Python has a recursion limit of 500) and bounded
(instructions per function, functions per program).  Recursion, indirect calls,
dynamic frames, unresolved imports and undecodable code are reported as making a
bound a lower bound, unknown or unbounded — never dropped.
"""

import bisect
import re
import struct

from ..disasm import BITS, direct_target, instruction_ids, memory_slot, parse_int
from ..errors import BadInput, UnreadableMemory
from ..pe import PEImage
from ..problems import ProblemLog
from .functions import MAX_JUMP_TABLE, ModuleFunctions
from .prologue import (ACCUMULATOR, CALLEE_SAVED, FP, KEEPS_ACCUMULATOR, PUSH_SIZE, SP, SP_MNEMONICS, STOPS, SpState,
                       apply_frame_helper, apply_sp_effect, cleanup_after, helper_call_effect)

MAX_INSTRUCTIONS_PER_FUNCTION = 40000
MAX_FUNCTIONS = 400000
MAX_CHAIN = 4096
MAX_REASONS = 3
IMPORT_LOAD_LOOKBACK = 8
ARM64_UNBOUNDED_BODY = 0x4000   # how far an ARM64 body without a .pdata range is followed
FRAME_POINTER_NAMES = ("x29", "fp")
SAVE_LOOKAHEAD = 48
# x86 callee-saved registers and the names of their parts.
REGISTER_PARTS = {"ebx": frozenset(["ebx", "bx", "bl", "bh"]), "esi": frozenset(["esi", "si"]),
                  "edi": frozenset(["edi", "di"]), "ebp": frozenset(["ebp", "bp"])}
# Writes of a whole register (not pop: an epilogue's pop restores the caller's value).
OVERWRITES = frozenset(["mov", "lea", "movzx", "movsx", "xor", "sub"])
ZEROES = frozenset(["xor", "sub"])
# `or edi, -1` / `and edi, 0`: a constant whatever the register held.
CONSTANT_RESULTS = frozenset([("or", "0xffffffff"), ("or", "-1"), ("and", "0")])

# Bytes that may begin what the x64 sweep acts on besides call sites: a direct
# call or jump (E8/E9 rel32 — capstone keeps rel32 under a 0x66 prefix in 64-bit
# mode — and EB rel8), and `sub rsp, X` with X a register, memory or a negative
# immediate (REX.W, then 29 /r with RSP as r/m, 2B /r with RSP as reg, or 81/83 /5
# on RSP).  Every position is tried, so instruction boundaries need not be known.
DIRECT_BRANCH = re.compile(rb"[\xe8\xe9\xeb]")
SUB_RSP = re.compile(rb"[\x48-\x4f](?:\x29[\xc4\xcc\xd4\xdc\xe4\xec\xf4\xfc]"
                     rb"|\x2b[\x20-\x27\x60-\x67\xa0-\xa7\xe0-\xe7]|[\x81\x83]\xec)")
REL32 = struct.Struct("<i")
# What the x64 sweep reads of a body (by capstone id, prefixed forms included:
# the sweep itself then checks the mnemonic).
SWEPT_INSTRUCTIONS = instruction_ids(["call", "jmp", "sub"])

EXACT, LOWER, UNKNOWN, UNBOUNDED = "exact", "lower", "unknown", "unbounded"
SEVERITY = {EXACT: 0, LOWER: 1, UNKNOWN: 2, UNBOUNDED: 3}


class CallSite(object):
    """One way control leaves a function for another: call, tail jump or import."""

    __slots__ = ("address", "depth", "target", "kind", "import_name", "import_slot")

    def __init__(self, address, depth, target, kind, import_name=None, import_slot=None):
        self.address = address
        self.depth = depth          # SP depth below the caller's return address here
        self.target = target        # callee VA, or None (indirect / not yet resolved)
        self.kind = kind            # "call" | "tail" | "indirect" | "indirect-tail"
        self.import_name = import_name
        self.import_slot = import_slot  # IAT slot VA for calls through an import

    @property
    def is_tail(self):
        return self.kind.endswith("tail")


class Bound(object):
    """Worst-case stack consumed by a call of a function, its return address included."""

    __slots__ = ("value", "status", "reasons", "via")

    def __init__(self, value, status=EXACT, reasons=(), via=None):
        self.value = value
        self.status = status
        self.reasons = tuple(reasons)
        self.via = via  # the CallSite on the worst path, or None for the function itself

    @property
    def depth(self):
        """The number to report: None when unbounded or unknown."""
        return self.value if self.status in (EXACT, LOWER) else None


class Program(object):
    """The modules under analysis: one PE file, or a target's loaded modules
    (loaded lazily when a call leads into them)."""

    def __init__(self, target=None):
        self.target = target
        self.modules = []  # ModuleFunctions
        self.problems = ProblemLog()
        self._failed_modules = set()

    def add_image(self, image, symbols=None):
        module = ModuleFunctions(image, symbols)
        self.modules.append(module)
        return module

    def add_target_module(self, module, symbols=None):
        """``symbols`` ({rva: name}) defaults to the target's symbols of the module."""
        image = PEImage.from_target(self.target, module)
        if symbols is None:
            table = self.target.symbols.module_symbols(module.name)
            if table is not None:
                symbols = table.names_by_rva()
        return self.add_image(image, symbols)

    def module_for(self, va, load=True):
        for module in self.modules:
            if module.contains(va):
                return module
        if not load or self.target is None:
            return None
        loaded = self.target.module_at(va)
        if loaded is None or loaded.base in self._failed_modules:
            return None
        try:
            return self.add_target_module(loaded)
        except (BadInput, UnreadableMemory) as error:
            self._failed_modules.add(loaded.base)
            self.problems.add("module_not_analysed", loaded.base, "cannot analyse %s: %s" % (loaded.name, error),
                              "warning")
            return None

    def function_at(self, va, origin="call"):
        module = self.module_for(va)
        if module is None:
            return None
        return module.add(va, origin)

    def function_count(self):
        return sum(len(module.functions) for module in self.modules)


class CallGraph(object):
    """Builds bodies on demand and computes worst-case bounds.

    ``call_sites=False`` is for the function list alone (frames, no depths): x64
    bodies with unwind data are then decoded only when their bytes may hold a
    direct call or jump to code not yet known as a function, or a dynamic
    allocation — the functions, frames and problems found are the same, the
    call sites are not recorded and :meth:`bound` is refused."""

    def __init__(self, program, call_sites=True):
        self.program = program
        self.call_sites = call_sites
        self.bounds = {}  # function VA -> Bound
        self._complete = set()  # modules whose every function has been followed
        self._sweep_leads = {}  # module -> SweepLeads or None (decode every body)

    # -- bodies ---------------------------------------------------------------------

    def analyse_all(self, module):
        """Follow every function of ``module``, including the ones found on the way."""
        self._complete.add(module)
        done = set()
        pointers_added = gaps_filled = False
        while True:
            todo = [module.functions[va] for va in sorted(module.functions.keys() - done)]
            if not todo:
                # Code pointers are taken once every body is known: one that points
                # inside a body is a label (a jump or exception target), not a function.
                if not pointers_added:
                    pointers_added = True
                    if module.add_code_pointers():
                        continue
                if module.arch == "x86" and not gaps_filled:
                    # What the gaps' bodies call is followed in one more round.
                    gaps_filled = True
                    self._fill_gaps(module)
                    continue
                break
            for function in todo:
                done.add(function.va)
                # In address order, a switch is followed before its case labels.
                if not module.drop_label(function):
                    self.analyse(function)
            if self.program.function_count() > MAX_FUNCTIONS:
                module.problems.add("too_many_functions", None, "more than %d functions: discovery stopped"
                                    % MAX_FUNCTIONS)
                break
        self._refine_x86(module)

    def _fill_gaps(self, module):
        """x86 code nothing reaches (no symbol, call or pointer: functions kept
        without references, or named only in a PDB) still runs when something
        reaches it indirectly: from each code section's start and after every
        followed body, padding skipped, code that no body covered starts a
        function of its own ("gap")."""
        base = module.image.image_base
        starts = sorted(module.functions)
        for low, high in module.image.backed_code_ranges():
            low, high = base + low, base + high
            first = bisect.bisect_left(starts, low)
            # [(where uncovered code may begin, where the next known function starts)]
            cursors = [(low, starts[first] if first < len(starts) and starts[first] < high else high)]
            for index in range(first, len(starts)):
                if starts[index] >= high:
                    break
                following = starts[index + 1] if index + 1 < len(starts) and starts[index + 1] < high else high
                cursors.append((module.functions[starts[index]].body_end, following))
            for cursor, limit in cursors:
                self._fill_gap(module, cursor, limit)

    def _fill_gap(self, module, cursor, limit):
        while cursor is not None and cursor < limit and self.program.function_count() < MAX_FUNCTIONS:
            start = module.skip_padding(cursor, limit)
            if start is None:
                return
            found = module.add(start, "gap")
            if found is None or found.analysed_body:
                return
            self.analyse(found)
            cursor = found.body_end if found.body_end and found.body_end > start else None

    def analyse(self, function):
        if function.analysed_body:
            return function
        function.analysed_body = True
        module = function.module
        if module.arch == "arm64":
            module.compute_frame(function)
            if function.fragment_of is None:
                _sweep_arm64(self.program, function)
            return function
        if function.fragment_of is None and module.arch == "x64" and function.unwind_size is not None \
                and function.end is not None:
            # The prologue scan (a cross-check of the unwind data) reads the
            # instructions the sweep decoded; nothing stays cached afterwards.
            _sweep_x64(self.program, function, self._leads(module))
            module.compute_frame(function)
            module.decoder.forget()
            return function
        module.compute_frame(function)
        if function.fragment_of is not None:
            # Fragments are followed as part of their primary function.
            return function
        _follow_body(self.program, function)
        return function

    def _leads(self, module):
        """The module's :class:`SweepLeads` when call sites are not wanted (built once),
        else None."""
        if self.call_sites or self.program.modules[0] is not module:
            # Leads judge call targets by this module's functions: that holds
            # when no earlier module can claim the same addresses.
            return None
        if module not in self._sweep_leads:
            try:
                self._sweep_leads[module] = SweepLeads(module)
            except _OverlappingRanges:
                self._sweep_leads[module] = None
        return self._sweep_leads[module]

    def _refine_x86(self, module):
        """x86: what a call does to the caller's ESP depends on the callee — how
        many bytes it pops (`ret N`), whether it moves ESP itself (``__chkstk``) —
        and which pushes before a call are its arguments depends on that.  Once
        every callee has been followed, scan and follow every function again."""
        if module.arch != "x86":
            return
        followed = set(module.functions)
        for function in list(module.functions.values()):
            function.prologue_size = None
            function.dynamic = None
            module.compute_frame(function)
            if function.fragment_of is None:
                _follow_body(self.program, function)
        # Followed again with every callee known, a body may reach calls the first
        # pass did not: those callees are followed too.
        while self.program.function_count() <= MAX_FUNCTIONS:
            found = sorted(module.functions.keys() - followed)
            if not found:
                break
            for va in found:
                followed.add(va)
                self.analyse(module.functions[va])

    # -- worst case -------------------------------------------------------------------

    def bound(self, root):
        """Worst-case Bound for a FunctionInfo (iterative depth-first search)."""
        if not self.call_sites:
            raise ValueError("this call graph records no call sites: it cannot bound a depth")
        if root.va in self.bounds:
            return self.bounds[root.va]
        if root.module.arch == "x86" and root.module not in self._complete:
            # x86 call-site depths depend on how many bytes each callee pops.
            self.analyse_all(root.module)
        on_path = {}   # va -> index in the explicit stack
        partial = {}   # va -> [best depth below the return address, status, reasons, via]
        stack = []     # [function, edge iterator, call site whose callee is being computed]

        def enter(function):
            self.analyse(function)
            on_path[function.va] = len(stack)
            partial[function.va] = _own_bound(function)
            stack.append([function, iter(function.call_sites), None])

        enter(root)
        while stack:
            frame = stack[-1]
            function, edges, pending = frame
            pointer = function.module.return_address_size
            entry = partial[function.va]
            if pending is not None:
                frame[2] = None
                _merge_site(entry, pending, self.bounds[self._callee(pending).va], pointer)
            descended = False
            for site in edges:
                callee = self._callee(site)
                if callee is None:
                    _merge_unresolved(entry, site, pointer)
                    continue
                known = self.bounds.get(callee.va)
                if known is not None:
                    _merge_site(entry, site, known, pointer)
                    continue
                if callee.va in on_path:
                    cycle = [item[0].display_name for item in stack[on_path[callee.va]:]]
                    cycle.append(callee.display_name)
                    _merge(entry, None, UNBOUNDED, ("recursion: " + " -> ".join(cycle[-8:]),), site)
                    continue
                frame[2] = site
                enter(callee)
                descended = True
                break
            if descended:
                continue
            best, status, reasons, via = partial.pop(function.va)
            value = None if best is None else best + pointer
            self.bounds[function.va] = Bound(value, status, reasons, via)
            del on_path[function.va]
            stack.pop()
        return self.bounds[root.va]

    def _callee(self, site):
        if site.target is None and site.import_slot is not None:
            # Resolved only when a bound needs it: that may load another module.
            site.target = _resolve_import(self.program, site.import_slot)
            site.import_slot = None
        if site.target is None:
            return None
        module = self.program.module_for(site.target)
        if module is None:
            return None
        return module.add(site.target, "call")

    def chain(self, root):
        """The worst path from ``root``: [(FunctionInfo, CallSite or None, Bound)]."""
        steps = []
        seen = set()
        function = root
        while function is not None and len(steps) < MAX_CHAIN:
            bound = self.bound(function)
            site = bound.via
            steps.append((function, site, bound))
            if function.va in seen or site is None:
                break
            seen.add(function.va)
            function = self._callee(site)
        return steps


def _own_bound(function):
    """[best depth below the return address, status, reasons, via] before callees."""
    status, reasons = EXACT, []
    if function.body_problem:
        # Part of the body was read, or the unwind data gave the frame: a lower bound.
        status = LOWER if function.frame_size is not None or function.call_sites else UNKNOWN
        reasons.append("%s: %s" % (function.display_name, function.body_problem))
    if function.dynamic:
        status = _worse(status, LOWER)
        reasons.append("%s: dynamic frame (%s)" % (function.display_name, function.dynamic))
    if function.sp_lost:
        status = _worse(status, LOWER)
        reasons.append("%s: stack pointer lost at %s" % (function.display_name, function.sp_lost))
    own = max(function.max_depth, function.frame_size or 0)
    return [None if status == UNKNOWN else own, status, reasons[:MAX_REASONS], None]


def _worse(a, b):
    return a if SEVERITY[a] >= SEVERITY[b] else b


def _merge(entry, value, status, reasons, site):
    """Fold one contribution into ``entry``.  The most severe status wins and its
    reasons come first; while the bound is finite, ``via`` is the deepest site,
    once it is unbounded/unknown ``via`` is the site that made it so."""
    best, current_status, current_reasons, via = entry
    if SEVERITY[status] > SEVERITY[current_status]:
        entry[1] = status
        entry[2] = (list(reasons) + [r for r in current_reasons if r not in reasons])[:MAX_REASONS]
        if status in (UNBOUNDED, UNKNOWN):
            entry[3] = site
    elif reasons and len(current_reasons) < MAX_REASONS:
        entry[2] = (list(current_reasons) + [r for r in reasons if r not in current_reasons])[:MAX_REASONS]
    if value is not None and (best is None or value > best):
        entry[0] = value
        if entry[1] not in (UNBOUNDED, UNKNOWN):
            entry[3] = site


def _merge_site(entry, site, callee_bound, pointer):
    if callee_bound.status in (UNBOUNDED, UNKNOWN):
        _merge(entry, None, callee_bound.status, callee_bound.reasons, site)
        return
    value = site.depth + callee_bound.value - (pointer if site.is_tail else 0)
    _merge(entry, value, callee_bound.status, callee_bound.reasons, site)


def _merge_unresolved(entry, site, pointer):
    if site.import_name:
        reason = "call into %s (not analysed)" % site.import_name
    elif site.target is not None:
        reason = "call to 0x%x outside the analysed code" % site.target
    else:
        reason = "indirect %s at 0x%x" % ("jump" if site.is_tail else "call", site.address)
    value = site.depth + (0 if site.is_tail else pointer)
    _merge(entry, value, LOWER, (reason,), None)


# -- following one function's body ----------------------------------------------------


def depths_in(program, function):
    """{instruction VA: SP depth below the return address} for one function — what
    a stack walk needs to find the return address from any RIP in it."""
    depths = {}
    _follow_body(program, function, depths)
    return depths


def _follow_body(program, function, record=None):
    """Worklist over the function's instructions with SP state per path;
    ``record`` (a dict) receives the depth at every instruction.

    This loop runs for every instruction of every function, so the common case (an
    instruction that neither branches nor touches SP) is kept to a few dict and
    string operations; everything else goes to helpers."""
    module = function.module
    decoder = module.decoder
    insns = decoder.instructions
    arch = module.arch
    pointer = PUSH_SIZE[arch]
    image = module.image
    functions = module.functions
    sp_mnemonics = SP_MNEMONICS
    tracked = ACCUMULATOR[arch] + (FP[arch], SP[arch])
    # `mov r11, rsp` / `lea r11, [rsp + X]`: copies of SP an epilogue may restore.
    sp_source, sp_memory = ", " + SP[arch], "[" + SP[arch]
    slot_marker = "rip" if arch == "x64" else "[0x"
    fragments = _fragment_ranges(module, function)
    for start, end in fragments:
        # Known extent: decode the rest of it (past what the prologue scan
        # already decoded) in one capstone call.
        insn = insns.get(start)
        while insn is not None and start < end:
            start += insn[1]
            insn = insns.get(start)
        if start < end:
            decoder.decode_range(start, end)
    function.call_sites = []
    function.max_depth = 0
    function.body_problem = None
    function.sp_lost = None
    code_ranges = [(image.image_base + section.rva, image.image_base + section.rva + section.size)
                   for section in image.sections if section.executable]
    code_start, code_end = 0, 0
    # Without base relocations (a module whose .reloc was discarded), functions
    # only reached through pointers are found from the code addresses the code
    # pushes or stores.
    address_taken = arch == "x86" and not image.relocations
    visited = set()
    labels = set()  # case labels of its jump tables (some may be taken for functions yet)
    # Registers loaded from an IAT slot (`mov rax, [__imp_X]; call rax`).
    import_loads = {}
    worklist = [(function.va, SpState())]
    # x86: {(callee-saved register, depth after its push)} met in the body (see _note_save).
    saves = set() if arch == "x86" else None
    steps = 0
    body_end = function.va
    table_size = None
    while worklist:
        address, state = worklist.pop()
        while address not in visited:
            if steps >= MAX_INSTRUCTIONS_PER_FUNCTION:
                function.body_problem = "more than %d instructions: analysis stopped" % MAX_INSTRUCTIONS_PER_FUNCTION
                worklist = []
                break
            if address in functions and address != function.va and address not in labels and _is_other_function(
                    module, function, fragments, address):
                # Fell through into the next function: control continues there.
                function.call_sites.append(CallSite(address, state.depth, address, "tail"))
                break
            if not code_start <= address < code_end:
                for code_start, code_end in code_ranges:
                    if code_start <= address < code_end:
                        break
                else:
                    code_start = code_end = 0
                    function.body_problem = "runs off the code section at 0x%x" % address
                    break
            insn = insns.get(address) or decoder.at(address)
            if insn is None:
                function.body_problem = decoder.problem(address)
                break
            visited.add(address)
            if address >= body_end:
                body_end = address + insn[1]
            if record is not None:
                record[address] = state.depth
            steps += 1
            _, size, mnemonic, op_str = insn
            next_address = address + size
            first = mnemonic[0]
            if first == "j" or first == "c" or first == "r" or first == "l" or mnemonic in STOPS:
                if mnemonic == "call":
                    if not _call(program, function, decoder, insn, state, arch, pointer, import_loads):
                        break
                    address = next_address
                    continue
                if mnemonic.startswith("ret"):
                    popped = parse_int(op_str) if op_str else 0
                    if popped:
                        function.ret_pop = popped
                    if state.lost:
                        # Returns with SP where a computation put it: a stack
                        # allocator (__chkstk) that moves its caller's SP.
                        function.moves_sp = True
                    break
                if first == "j" or mnemonic.startswith("loop"):
                    target = direct_target(op_str)
                    if mnemonic == "jmp":
                        if target is None and arch == "x86" and "*4 + 0x" in op_str:
                            cases = module.jump_table(function, op_str, table_size)
                            if cases:
                                labels.update(cases)
                                worklist.extend((case, state.copy()) for case in cases)
                                break
                        _jump(program, function, fragments, insn, state, target, worklist, arch)
                        break
                    if target is not None:
                        if _is_other_function(module, function, fragments, target):
                            function.call_sites.append(CallSite(address, state.depth, target, "tail"))
                        else:
                            worklist.append((target, state.copy()))
                    address = next_address
                    continue
                if mnemonic in STOPS:
                    break
            if (mnemonic == "cmp" or mnemonic == "and") and arch == "x86":
                # `cmp eax, 7; ja default` / `and eax, 7` before `jmp [eax*4 + table]`:
                # the table has imm + 1 entries.
                bound = parse_int(op_str.rpartition(", ")[2])
                table_size = bound + 1 if bound is not None and 0 <= bound < MAX_JUMP_TABLE else None
            if mnemonic == "mov" and slot_marker in op_str:
                _note_import_load(module, arch, op_str, next_address, import_loads)
            if address_taken and (mnemonic == "push" or mnemonic == "mov") and "0x" in op_str:
                _note_address_taken(program, op_str, code_ranges)
            if saves is not None and (mnemonic == "push" or mnemonic == "pop"):
                _note_save(function, saves, insn, state)
            # Only a destination of SP, FP or the accumulator matters (operands like
            # [rsp + 8] read memory and leave SP alone).
            if mnemonic in sp_mnemonics or op_str.startswith(tracked) or (
                    mnemonic == "mov" and op_str.endswith(sp_source)) or (
                    mnemonic == "lea" and sp_memory in op_str) or (
                    state.copies and op_str.partition(",")[0] in state.copies):
                step = apply_sp_effect(arch, mnemonic, op_str, state)
                if state.depth > function.max_depth:
                    function.max_depth = state.depth
                if step is not None:
                    if step.switched:
                        break
                    if step.dynamic:
                        if function.dynamic is None:
                            function.dynamic = step.dynamic
                    elif step.unknown and function.sp_lost is None:
                        function.sp_lost = "0x%x (%s)" % (address, step.unknown)
                        break
            elif state.accumulator is not None and mnemonic not in KEEPS_ACCUMULATOR:
                state.accumulator = None
            address = next_address
    function.body_end = body_end
    if record is None:
        _report_body_problem(function)


def _note_save(function, saves, insn, state):
    """x86: a callee-saved register pushed in the body with no argument pushed
    before it since the last call, then written before it is read (its value was
    the caller's: a save, not an argument) and popped back into itself at the same
    depth was saved there — MSVC pushes saves only on the paths that use the
    register, past a call, a loop or a jump table, and FrameData counts them in
    the frame.  The frame takes the depth of such a save, less what stdcall
    imports may have popped unseen before it (``unsure``).  Other pushes count as
    the next call's possible arguments (``pushed``)."""
    address, size, mnemonic, register = insn
    depth = state.depth - state.unsure
    # Pushes no deeper than the frame are no arguments (an `add esp, N` freed them).
    state.pushed = min(state.pushed, max(0, depth - (function.prologue_size or 0)))
    if mnemonic == "push":
        if register in CALLEE_SAVED["x86"] and not state.pushed and _overwritten_before_read(
                function.module.decoder, address + size, register):
            saves.add((register, depth + PUSH_SIZE["x86"]))
        else:
            state.pushed += PUSH_SIZE["x86"]
        return
    state.pushed = max(0, state.pushed - PUSH_SIZE["x86"])
    if (register, depth) in saves and depth == min(saved for name, saved in saves if name == register):
        # A register is saved once: a deeper push of one already saved is an
        # argument (`xor edi, edi; push edi; push 0; call GetProcessHeap`).
        frame = depth - state.padding
        if function.prologue_size is not None and frame > function.prologue_size:
            function.prologue_size = frame


def _overwritten_before_read(decoder, address, register):
    """True when the code from ``address`` (calls stepped over, conditional
    branches not taken) writes x86 ``register`` before reading it: ``mov esi, ...``,
    ``lea esi, ...``, ``xor esi, esi`` without ``esi`` (or a part of it) on the
    right, ``or esi, -1``, ``push 0x20; pop esi``, ``cpuid`` for EBX."""
    names = REGISTER_PARTS[register]
    # Every name of the register or of a part holds these letters (esi, si; ebx, bl, bh).
    letters = ("b", "si", "di", "bp")[("ebx", "esi", "edi", "ebp").index(register)]
    previous = None
    for _ in range(SAVE_LOOKAHEAD):
        insn = decoder.at(address)
        if insn is None:
            return False
        mnemonic, op_str = insn[2], insn[3]
        if mnemonic == "jmp" or mnemonic.startswith("ret") or mnemonic in STOPS:
            return False
        if mnemonic == "cpuid" and register == "ebx":
            return True
        if mnemonic == "pop" and op_str == register and previous is not None and previous[2] == "push" \
                and parse_int(previous[3]) is not None:
            return True     # `push 0x20; pop edi`: a constant, in three bytes
        previous = insn
        if letters not in op_str:
            address += insn[1]
            continue
        destination, _, source = op_str.partition(", ")
        if mnemonic == "push" and op_str == register:
            # Kept again around an instruction that writes it (`push ebx; cpuid;
            # ...; pop ebx`): the next push is no use of the value.
            address += insn[1]
            continue
        if destination == register and (mnemonic, source) in CONSTANT_RESULTS:
            return True
        if destination == register and mnemonic in OVERWRITES and (
                not names.intersection(re.findall(r"\w+", source)) or (mnemonic in ZEROES and source == register)):
            return True
        if names.intersection(re.findall(r"\w+", op_str)):
            return False
        address += insn[1]
    return False


def _report_body_problem(function):
    if function.body_problem:
        function.module.problems.add("function_not_followed", function.va, "%s: %s"
                                     % (function.display_name, function.body_problem), "warning")


def _sweep_x64(program, function, leads=None):
    """An x64 function with unwind data, by one linear pass over its .pdata ranges
    (and its chained fragments): the unwind data gives the frame, and x64 code
    calls at the full frame depth — every call site after the prologue is at
    depth = frame size, every jump out of the function is a tail call made after
    the epilogue.  What remains to find is the call sites and a dynamic
    allocation (`sub rsp, rax` after the prologue).

    With ``leads`` (:class:`SweepLeads`, when the call sites are not wanted) a
    body they clear is only checked for undecodable code."""
    module = function.module
    decoder = module.decoder
    prolog_end = function.prolog_end or function.va
    function.call_sites = []
    function.max_depth = function.unwind_size
    function.body_problem = None
    function.sp_lost = None
    fragments = _fragment_ranges(module, function)
    decode = leads is None or leads.may_find_more(program, function, fragments)
    for start, end in fragments:
        run, stopped = decoder.run(start, end, keep=start == function.va)
        with run:
            if stopped is not None and function.body_problem is None:
                function.body_problem = "code at 0x%x is not readable or not decodable" % stopped
            if decode:
                _sweep_run(program, function, fragments, run, prolog_end)
    function.body_end = fragments[0][1]
    _report_body_problem(function)


def _sweep_arm64(program, function):
    """An ARM64 function by one linear pass over its range (its ``.pdata``
    entry's, with its chained fragments; up to the next known function, at most
    ARM64_UNBOUNDED_BODY bytes, for code without an entry): every call site is at
    the frame's depth (:attr:`FunctionInfo.frame_size`).  ``bl`` is a call,
    ``blr`` an indirect call (or an import's, when the register was loaded from
    an import slot by ``adrp``/``ldr``), ``b`` out of the range a tail call,
    ``br`` an indirect jump (an import thunk's when loaded from a slot), and
    ``sub sp, sp, xN`` or ``mov sp, xN`` after the prologue a dynamic frame."""
    module = function.module
    image = module.image
    base = image.image_base
    imports = image.imports
    frame = function.frame_size or 0
    prolog_end = function.prolog_end or function.va
    function.call_sites = sites = []
    function.max_depth = frame
    function.body_problem = None
    fragments = _fragment_ranges(module, function)
    if function.end is None:
        starts = module.starts()
        following = bisect.bisect_right(starts, function.va)
        limit = starts[following] if following < len(starts) else base + image.size_of_image
        fragments = [(function.va, min(limit, function.va + ARM64_UNBOUNDED_BODY))]
    page_of, slot_in = {}, {}     # register -> adrp page; register -> the import slot it was loaded from
    for start, end in fragments:
        code = image.read_partial(start - base, end - start)
        if len(code) < end - start and function.end is not None and function.body_problem is None:
            function.body_problem = "code at 0x%x is not readable" % (start + len(code))
        for address, _, mnemonic, op_str in _arm64_instructions(module.decoder.disassembler, code, start):
            operands = [part.strip() for part in op_str.split(",")]
            if mnemonic == "bl":
                if address < prolog_end:
                    continue  # a call inside the prologue is the stack probe
                target = parse_int(op_str.lstrip("#"))
                if target is not None:
                    program.function_at(target)
                sites.append(CallSite(address, frame, target, "call"))
            elif mnemonic in ("blr", "br"):
                slot = slot_in.get(op_str)
                name = imports.get(slot - base) if slot is not None else None
                if mnemonic == "blr":
                    sites.append(CallSite(address, frame, None, "call", name, slot) if name
                                 else CallSite(address, frame, None, "indirect"))
                else:
                    sites.append(CallSite(address, 0, None, "tail", name, slot) if name
                                 else CallSite(address, frame, None, "indirect-tail"))
            elif mnemonic == "b":
                target = parse_int(op_str.lstrip("#"))
                if target is not None and not _inside(function, fragments, target):
                    program.function_at(target)
                    sites.append(CallSite(address, 0, target, "tail"))
                if function.end is None:
                    break
            elif mnemonic == "ret" and function.end is None:
                break
            elif mnemonic == "adrp":
                page_of[operands[0]] = parse_int(operands[1].lstrip("#"))
            elif mnemonic == "ldr" and len(operands) == 3 and operands[1][1:] in page_of \
                    and operands[2].startswith("#") and operands[2].endswith("]"):
                page = page_of[operands[1][1:]]
                offset = parse_int(operands[2][1:-1])
                if page is not None and offset is not None:
                    slot_in[operands[0]] = page + offset
            elif operands[0] == "sp" and address >= prolog_end and function.dynamic is None and (
                    mnemonic == "mov" and operands[1] not in FRAME_POINTER_NAMES or
                    mnemonic == "sub" and len(operands) == 3 and not operands[2].startswith("#")):
                # Neither the epilogue's `mov sp, x29` nor the probe's `sub sp, sp, x15, lsl #4`.
                function.dynamic = "%s %s" % (mnemonic, op_str)
        if function.end is None:
            break
    function.body_end = fragments[0][1]
    _report_body_problem(function)


def _arm64_instructions(disassembler, code, address):
    """The instructions of ARM64 ``code`` (bytes at ``address``) as
    ``(address, size, mnemonic, op_str)``; an undecodable word (data in the code:
    a literal pool, padding) is skipped, every instruction being 4 bytes."""
    offset = 0
    while offset + 4 <= len(code):
        reached = offset
        for insn in disassembler.decode(code[offset:], address + offset):
            yield insn
            reached = insn[0] + insn[1] - address
        offset = reached + 4


def _sweep_run(program, function, fragments, run, prolog_end):
    """The call sites, tail jumps and dynamic allocation of one decoded range."""
    image = function.module.image
    imports = image.imports
    base = image.image_base
    frame = function.unwind_size
    sites = function.call_sites
    # Calls into this module's functions resolve here unless an earlier module
    # claims the same addresses (overlapping modules of a corrupt dump).
    known = function.module.functions if program.modules[0] is function.module else {}
    for index in run.indices_of(SWEPT_INSTRUCTIONS):
        address, size, mnemonic, op_str = run[index]
        if mnemonic == "call":
            if address < prolog_end:
                continue  # a call inside the prologue is the stack probe
            target = direct_target(op_str)
            if target is not None:
                callee = known.get(target)
                if callee is None or callee.name is None:
                    # Adding a known function with a name changes nothing.
                    program.function_at(target)
                sites.append(CallSite(address, frame, target, "call"))
                continue
            slot = memory_slot(64, op_str, address + size)
            if slot is None:
                slot = _import_load_before(
                    [run[before] for before in range(max(0, index - IMPORT_LOAD_LOOKBACK), index)], op_str)
            name = imports.get(slot - base) if slot is not None else None
            sites.append(CallSite(address, frame, None, "call", name, slot) if name
                         else CallSite(address, frame, None, "indirect"))
        elif mnemonic == "jmp":
            target = direct_target(op_str)
            if target is None:
                slot = memory_slot(64, op_str, address + size)
                name = imports.get(slot - base) if slot is not None else None
                if name:
                    sites.append(CallSite(address, 0, None, "tail", name, slot))
                elif "[" in op_str or op_str.startswith("r"):
                    sites.append(CallSite(address, frame, None, "indirect-tail"))
            elif not _inside(function, fragments, target):
                program.function_at(target)
                sites.append(CallSite(address, 0, target, "tail"))
        elif mnemonic == "sub" and op_str.startswith("rsp, ") and address >= prolog_end \
                and direct_target(op_str[5:]) is None and function.dynamic is None:
            function.dynamic = "%s %s" % (mnemonic, op_str)


class SweepLeads(object):
    """Where, in the x64 bodies with unwind data, :func:`_sweep_x64` may find more
    than call sites, from one pass over the code bytes at every offset (no
    instruction boundaries needed, so a superset of what decoding finds):

    * ``dynamic``: primary function VAs whose ranges hold `sub rsp, X` bytes after
      the prologue;
    * ``branches``: {primary function VA: [(opcode, target)]}, the E8/E9/EB bytes
      whose target is neither a known function that adding would not rename nor
      inside the range the bytes are in.

    A body with neither is decoded only for the undecodable-code check: its sweep
    would add no function and find no dynamic frame."""

    def __init__(self, module):
        self.dynamic = set()
        self.branches = {}
        self._module = module
        self._ranges = ranges = sorted((function.va, function.end, function.fragment_of or function.va)
                                       for function in module.functions.values() if function.end is not None)
        self._starts = [low for low, _, _ in ranges]
        for index in range(1, len(ranges)):
            if ranges[index][0] < ranges[index - 1][1]:
                # Overlapping .pdata ranges: the bytes do not tell whose body they are.
                raise _OverlappingRanges()
        base = module.image.image_base
        backed = [(base + low, base + high) for low, high in module.image.backed_code_ranges()]
        for low, high in backed:
            self._scan(low, high)
        # A range reaching past the backed code (a corrupt end, a section's
        # zero-filled tail) is swept over the bytes read there: scanned on its own.
        for low, high, _ in ranges:
            if not any(start <= low and high <= end for start, end in backed):
                self._scan(low, high)

    def _scan(self, low, high):
        """Record the leads in the bytes [low, high) (VAs) the ranges cover."""
        module = self._module
        image = module.image
        functions = module.functions
        ranges, starts = self._ranges, self._starts
        get, names, rel32, bisect_right = functions.get, module.names, REL32.unpack_from, bisect.bisect_right
        code = image.read_partial(low - image.image_base, high - low)
        for found in SUB_RSP.finditer(code):
            address = low + found.start()
            index = bisect_right(starts, address) - 1
            if index >= 0 and address < ranges[index][1]:
                primary = get(ranges[index][2])
                if primary is not None and address >= (primary.prolog_end or primary.va):
                    self.dynamic.add(primary.va)
        # Per byte found: most are real calls to named functions, skipped first.
        last = len(code) - 5
        for found in DIRECT_BRANCH.finditer(code):
            offset = found.start()
            if code[offset] == 0xEB:
                if offset > last + 3:
                    continue
                target = low + offset + 2 + (code[offset + 1] ^ 0x80) - 0x80
            elif offset > last:
                continue
            else:
                # A negative target (no image is mapped so low) is outside every module.
                target = low + offset + 5 + rel32(code, offset + 1)[0]
            known = get(target)
            if known is not None and (known.name is not None or target not in names):
                continue
            address = low + offset
            index = bisect_right(starts, address) - 1
            if index < 0 or address >= ranges[index][1]:
                continue
            range_low, range_high, primary = ranges[index]
            if code[offset] != 0xE8 and range_low <= target < range_high:
                continue
            self.branches.setdefault(primary, []).append((code[offset], target))

    def may_find_more(self, program, function, fragments):
        """True when ``function``'s sweep may add a function or find a dynamic frame."""
        if function.va in self.dynamic:
            return True
        module = function.module
        for opcode, target in self.branches.get(function.va, ()):
            known = module.functions.get(target)
            if known is not None:
                if known.name is None and target in module.names:
                    return True
                continue
            if opcode != 0xE8 and _inside(function, fragments, target):
                continue
            if module.contains(target):
                if module.image.is_code(target - module.image.image_base):
                    return True
            elif program.target is not None or program.module_for(target, load=False) is not None:
                return True
        return False


class _OverlappingRanges(Exception):
    pass


def _import_load_before(preceding, register):
    """The IAT slot ``register`` was loaded from (`mov rax, [rip + __imp_X]`) within
    the ``preceding`` few instructions (before `call rax`), or None."""
    for address, size, mnemonic, op_str in reversed(preceding):
        destination, _, source = op_str.partition(", ")
        if destination == register:
            return memory_slot(64, source, address + size) if mnemonic == "mov" else None
    return None


def _fragment_ranges(module, function):
    ranges = []
    if function.end is not None:
        ranges.append((function.va, function.end))
    ranges.extend(module.fragments_of(function.va))
    return ranges


def _inside(function, fragments, address):
    if not fragments:
        return True
    for start, end in fragments:
        if start <= address < end:
            return True
    return False


def _is_other_function(module, function, fragments, target):
    """True when ``target`` starts another known function (not this one's fragment)."""
    if target == function.va or (fragments and _inside(function, fragments, target)):
        return False
    other = module.functions.get(target)
    return other is not None and other.fragment_of != function.va


def _jump(program, function, fragments, insn, state, target, worklist, arch):
    module = function.module
    address, size, _, op_str = insn
    if target is None:
        slot = memory_slot(BITS[arch], op_str, address + size)
        import_name = module.image.imports.get(slot - module.image.image_base) if slot is not None else None
        if import_name:
            function.call_sites.append(CallSite(address, state.depth, None, "tail", import_name, slot))
            if address == function.va:
                function.thunk_of = import_name
                if function.name is None:
                    function.name = "thunk:" + import_name
        else:
            function.call_sites.append(CallSite(address, state.depth, None, "indirect-tail"))
        return
    if _is_other_function(module, function, fragments, target):
        function.call_sites.append(CallSite(address, state.depth, target, "tail"))
        return
    if not module.contains(target):
        function.call_sites.append(CallSite(address, state.depth, target, "tail"))
        return
    inside = _inside(function, fragments, target) if fragments else target >= function.va
    if state.depth == 0 and not inside:
        # An epilogue's jump out of the function: a tail call to a function that
        # has no other record (a leaf without .pdata).
        program.function_at(target)
        function.call_sites.append(CallSite(address, state.depth, target, "tail"))
        return
    worklist.append((target, state.copy()))


def _note_address_taken(program, op_str, code_ranges):
    value = parse_int(op_str.rpartition(" ")[2])
    if value is None:
        return
    for start, end in code_ranges:
        if start <= value < end:
            program.function_at(value, "address-taken")
            return


def _note_import_load(module, arch, op_str, next_address, import_loads):
    register, _, source = op_str.partition(", ")
    if "[" in register:
        return
    slot = memory_slot(BITS[arch], source, next_address)
    if slot is not None and slot - module.image.image_base in module.image.imports:
        import_loads[register] = slot
    else:
        import_loads.pop(register, None)


def _call(program, function, decoder, insn, state, arch, pointer, import_loads):
    """Record a call site and apply its effect on SP; False ends the path."""
    module = function.module
    address, size, _, op_str = insn
    target = direct_target(op_str)
    helper = module.callee_kind(target) if target is not None else None
    effect = helper_call_effect(arch, decoder, insn, state, helper)
    if effect is not None:
        kind, detail = effect
        if kind == "frame":
            if not apply_frame_helper(decoder, function.va, address, state, detail):
                function.sp_lost = "0x%x (%s helper without a constant local size)" % (address, detail)
                return False
        elif kind == "dynamic":
            state.accumulator = None
            if function.dynamic is None:
                function.dynamic = "call at 0x%x allocates a variable size on the stack" % address
        else:
            if detail:
                # Keep the size only for the `sub sp, ax` after a non-moving probe.
                state.accumulator = None
            state.depth += detail
        if state.depth > function.max_depth:
            function.max_depth = state.depth
        return True
    if target is not None:
        callee = program.function_at(target)
        function.call_sites.append(CallSite(address, state.depth, target, "call"))
        if helper == "epilog":
            frame = state.copies.pop(FP[arch], None)
            if frame is None:
                function.sp_lost = "0x%x (SEH epilogue without a frame pointer)" % address
                return False
            state.depth = frame - pointer
        # A `jmp rel32` thunk (its own body a tail call) pops what its target does.
        popped = (module.pops_of(target) if callee is not None and callee.module is module
                  else callee.ret_pop if callee is not None else 0) or 0
        if helper != "epilog":
            state.depth -= popped
        if callee is None or callee.thunk_of is not None:
            _unseen_pops(function, decoder, address + size, state, arch)
        elif arch == "x86":
            # What it takes of the pushes: its `ret N` and the cleanup after it (a
            # helper that takes none, like the CFG check before `call esi`, keeps them).
            state.pushed = max(0, state.pushed - popped - (cleanup_after(decoder, address + size) or 0))
        state.accumulator = None
        return True
    slot = memory_slot(BITS[arch], op_str, address + size)
    if slot is None:
        slot = import_loads.get(op_str)
    import_name = module.image.imports.get(slot - module.image.image_base) if slot is not None else None
    if import_name:
        function.call_sites.append(CallSite(address, state.depth, None, "call", import_name, slot))
    else:
        function.call_sites.append(CallSite(address, state.depth, None, "indirect"))
    _unseen_pops(function, decoder, address + size, state, arch)
    state.accumulator = None
    return True


def _unseen_pops(function, decoder, after_call, state, arch):
    """x86: a call to an import (directly or through its thunk) or an indirect
    call with no cleanup after it is stdcall: the callee popped (up to) the pushes
    since the last call above the frame — ``state.unsure`` keeps them.  A cleanup
    takes what it frees of the pushes (``push fmt; push 2; call [__acrt_iob_func];
    add esp, 4`` leaves ``fmt`` for the next call)."""
    if arch != "x86":
        return
    cleanup = cleanup_after(decoder, after_call)
    if cleanup is None:
        state.unsure += min(state.pushed, max(0, state.depth - state.unsure - (function.prologue_size or 0)))
        state.pushed = 0
    else:
        state.pushed = max(0, state.pushed - cleanup)


def _resolve_import(program, slot):
    """The function an IAT slot points to, when the image is the loaded one (the
    loader wrote the import's address there) and its module is in the target."""
    module = program.module_for(slot, load=False)
    if module is None or module.image.origin != "memory" or program.target is None:
        return None
    value = module.image.pointer(slot - module.image.image_base)
    if value is None:
        return None
    other = program.module_for(value)
    if other is None or other is module:
        return None
    other.add(value, "import")
    return value
