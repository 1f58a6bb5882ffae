"""x86 frame data from a PDB, used as dbghelp uses it to unwind functions built
without a frame pointer (FPO).

The DBI stream's optional debug header names two streams:

* **FPO** (index 0): ``FPO_DATA`` records (16 bytes) — function start and size,
  locals (dwords), parameters (dwords), prologue length, saved registers,
  whether EBP is used, frame type (FPO, trap, TSS, non-FPO);
* **FrameData** (index 9, "New FPO"): ``FRAMEDATA`` records (32 bytes) — a block's
  RVA and size, ``cbLocals``, ``cbParams``, ``cbStkMax``, prologue and saved
  register sizes, flags, and a *program string* (an offset into the ``/names``
  string table) that computes the caller's registers.  MSVC writes several
  nested records per function, one from each point where its prologue has
  pushed another register; the innermost record covering an address applies.

A program string is postfix: ``$T0 .raSearch = $eip $T0 ^ = $esp $T0 4 + =``
assigns ``$T0`` the address where the return address was found, then ``$eip`` the
value there and ``$esp`` the address above it.  Operands are registers
(``$eip``, ``$esp``, ``$ebp``, ``$ebx``, ``$esi``, ``$edi``; newer compilers write
CodeView register numbers such as ``$20`` for EBX), temporaries (``$T0``..),
numbers and the frame's values ``.raSearch``/``.raSearchStart``, ``.cbLocals``,
``.cbSavedRegs``, ``.cbParams``; operators ``+ - * / %``, ``@`` (align down),
``^`` (read a dword) and ``=`` (assign).  ``.raSearch`` is found as dbghelp and
Breakpad find it: from ESP + the callee's parameters + ``cbLocals`` +
``cbSavedRegs``, the first of four slots holding a return address; past them (a
call site whose arguments are pushed: ``push``es are not in the record), the
first slot up to 64 whose value a ``call`` precedes or, where the code cannot be
read, that lies inside a function the PDB describes.

PDBs relinked with OMAP keep frame data in the pre-relink RVAs: a record is
looked up at the image's RVA mapped back through the PDB's OMAP
(:meth:`FrameTable.find`).
"""

import bisect
import struct

from .pdb import OPTIONAL_DEBUG_FPO, OPTIONAL_DEBUG_FRAME_DATA, PdbError

FPO_DATA = struct.Struct("<IIIHH")            # ulOffStart cbProcSize cdwLocals cdwParams bits
FRAME_DATA = struct.Struct("<IIIIIIHHI")      # rva block locals params stkmax program prolog savedregs flags
FRAME_FPO, FRAME_TRAP, FRAME_TSS, FRAME_NONFPO = 0, 1, 2, 3
FRAME_DATA_FUNCTION_START = 4                 # flags bit: the record starts a function
MAX_NESTED_RECORDS = 64    # records a lookup looks back through for the one covering an address
RA_SEARCH_SLOTS = 4        # .raSearch: the computed slot and three above (a realigned stack) ...
RA_SEARCH_CONFIRMED_SLOTS = 64  # ... then, past outgoing arguments pushed at a call, only a confirmed one
MAX_PROGRAM_TOKENS = 256

# CodeView register numbers (CV_REG_*) that program strings may use for x86 registers.
CV_REGISTERS = {17: "$eax", 18: "$ecx", 19: "$edx", 20: "$ebx", 21: "$esp", 22: "$ebp", 23: "$esi", 24: "$edi",
                33: "$eip"}
FPO_PROGRAM = "$T0 .raSearch = $eip $T0 ^ = $esp $T0 4 + ="
FRAME_POINTER_PROGRAM = "$T0 $ebp = $eip $T0 4 + ^ = $ebp $T0 ^ = $esp $T0 8 + ="


class FrameRecord(object):
    """One FPO or FrameData record: the block [rva, rva+size) it covers, its sizes
    in bytes, and the program that unwinds it."""

    __slots__ = ("rva", "size", "locals", "params", "saved_registers", "prolog", "program", "function_start",
                 "source")

    def __init__(self, rva, size, locals_, params, saved_registers, prolog, program, function_start, source):
        self.rva = rva
        self.size = size
        self.locals = locals_
        self.params = params
        self.saved_registers = saved_registers
        self.prolog = prolog
        self.program = program
        self.function_start = function_start
        self.source = source            # "framedata" or "fpo"

    @property
    def uses_frame_pointer(self):
        """The program reads the caller's frame from EBP (an EBP frame, not FPO)."""
        return self.program.startswith("$T0 $ebp =")

    @property
    def frame_bytes(self):
        """The function's stack below its return address where this record applies,
        outgoing arguments aside: ``cbLocals + cbSavedRegs``, plus the saved EBP of
        a frame-pointer function (EBP frames — also those whose EBP points into the
        locals: ``$T0 $ebp 204 + =`` — and realigned ones whose program reads EBP
        back from below the return address), which ``cbSavedRegs`` leaves out."""
        tokens = self.program.split()
        saved_ebp = tokens[:2] == ["$T0", "$ebp"] or "$ebp $T1 4 - ^ =" in " ".join(tokens)
        return self.locals + self.saved_registers + (4 if saved_ebp else 0)

    def __repr__(self):
        return "FrameRecord(0x%x+0x%x, %s, %r)" % (self.rva, self.size, self.source, self.program)


class FrameTable(object):
    """A module's frame records, looked up by RVA (FrameData before FPO), and
    where its functions start (procedures and public functions: an assembler
    function such as ``_chkstk`` has a public symbol and no frame record)."""

    def __init__(self, frame_data, fpo, function_starts=(), procedures=(), to_source=None):
        self.frame_data = sorted(frame_data, key=lambda record: (record.rva, -record.size))
        self.fpo = sorted(fpo, key=lambda record: record.rva)
        self._starts = [record.rva for record in self.frame_data]
        self._fpo_starts = [record.rva for record in self.fpo]
        self.function_starts = frozenset(function_starts)
        self._procedures = sorted(procedures)           # (rva, size) of the PDB's procedures
        self._procedure_starts = [rva for rva, _ in self._procedures]
        # Frame records keep the addresses of the image before an OMAP relink; the
        # procedures and every caller use the relinked image's.
        self._to_source = to_source

    def inside_function(self, rva):
        """True when ``rva`` lies inside a function the PDB describes (a procedure,
        or a frame record's block) past its first byte: where a return address can
        point.  Code is then not needed to tell one from a pointer to data."""
        if rva in self.function_starts:
            return False
        index = bisect.bisect_right(self._procedure_starts, rva) - 1
        if index >= 0 and rva < sum(self._procedures[index]):
            return True
        return self.find(rva) is not None

    def __len__(self):
        return len(self.frame_data) + len(self.fpo)

    def function_frames(self):
        """{function start RVA: its deepest :attr:`FrameRecord.frame_bytes`} over
        each FrameData function's start record and the records nested in it."""
        frames = {}
        start = None
        for record in self.frame_data:
            if record.function_start:
                start = record
                frames[record.rva] = record.frame_bytes
            elif start is not None and record.rva < start.rva + start.size:
                frames[start.rva] = max(frames[start.rva], record.frame_bytes)
        return frames

    def find(self, rva):
        """The innermost record covering the image's ``rva``, or None."""
        if self._to_source is not None:
            rva = self._to_source(rva)
            if rva is None:
                return None
        return _covering(self.frame_data, self._starts, rva) or _covering(self.fpo, self._fpo_starts, rva)


def _covering(records, starts, rva):
    index = bisect.bisect_right(starts, rva) - 1
    for at in range(index, max(-1, index - MAX_NESTED_RECORDS), -1):
        record = records[at]
        if rva < record.rva + record.size:
            return record
    return None


def read_frame_table(pdb):
    """The :class:`FrameTable` of ``pdb`` (a :class:`~dbgext.symbols.pdb.PdbFile`);
    raises PdbError when its streams are corrupt."""
    frame_data = []
    data = pdb.debug_stream(OPTIONAL_DEBUG_FRAME_DATA, "FrameData stream")
    if data:
        names = pdb.string_table()
        # A stream whose size is not a multiple of the record starts with a relocation pointer.
        start = len(data) % FRAME_DATA.size
        for rva, size, locals_, params, _, program, prolog, saved, flags in FRAME_DATA.iter_unpack(data[start:]):
            frame_data.append(FrameRecord(rva, size, locals_, params, saved, prolog,
                                          _string_at(pdb, names, program), bool(flags & FRAME_DATA_FUNCTION_START),
                                          "framedata"))
    fpo = []
    data = pdb.debug_stream(OPTIONAL_DEBUG_FPO, "FPO stream")
    if data:
        for rva, size, locals_, params, bits in FPO_DATA.iter_unpack(data[:len(data) - len(data) % FPO_DATA.size]):
            prolog, registers, frame = bits & 0xFF, (bits >> 8) & 7, bits >> 14
            if frame not in (FRAME_FPO, FRAME_NONFPO):
                continue  # trap and TSS frames: kernel transitions, not walked from a PDB
            # An FPO function that allocates EBP for its own use saved the caller's
            # somewhere among its saved registers: the caller's EBP stays unknown.
            program = FRAME_POINTER_PROGRAM if frame == FRAME_NONFPO else FPO_PROGRAM
            fpo.append(FrameRecord(rva, size, locals_ * 4, params * 4, registers * 4, prolog, program, True, "fpo"))
    procedures = [(procedure.rva, procedure.size) for procedure in pdb.procedures()]
    starts = set(rva for rva, _ in procedures)
    starts.update(public.rva for public in pdb.publics() if public.is_function)
    return FrameTable(frame_data, fpo, starts, procedures, pdb.source_rva)


def _string_at(pdb, names, offset):
    end = names.find(b"\0", offset)
    if offset >= len(names) or end < 0:
        raise PdbError(pdb.path, "FrameData program string", "offset 0x%x outside the string table" % offset)
    return names[offset:end].decode("latin-1")


# -- program strings ---------------------------------------------------------------------------

class ProgramError(Exception):
    """A program string that cannot be evaluated (the walker falls back)."""


def evaluate(program, values, read_dword):
    """Run ``program`` over ``values`` ({"$esp": ..., ".raSearch": ...}: a name
    missing is looked up only when used); returns the variables it assigned.
    ``read_dword(address)`` serves ``^``."""
    tokens = program.split()
    if len(tokens) > MAX_PROGRAM_TOKENS:
        raise ProgramError("a program of %d tokens" % len(tokens))
    stack, assigned = [], {}
    for token in tokens:
        if token in ("+", "-", "*", "/", "%", "@"):
            if len(stack) < 2:
                raise ProgramError("%r needs two operands" % token)
            right, left = _value(stack.pop(), values, assigned), _value(stack.pop(), values, assigned)
            stack.append(_arithmetic(token, left, right))
        elif token == "^":
            if not stack:
                raise ProgramError("^ needs an operand")
            stack.append(read_dword(_value(stack.pop(), values, assigned) & 0xFFFFFFFF))
        elif token == "=":
            if len(stack) < 2:
                raise ProgramError("= needs a name and a value")
            value, name = stack.pop(), stack.pop()
            if not isinstance(name, str) or not name.startswith("$"):
                raise ProgramError("= assigns to %r" % (name,))
            assigned[_register_name(name)] = _value(value, values, assigned) & 0xFFFFFFFF
        elif token[0] in "$.":
            stack.append(token)
        else:
            try:
                stack.append(int(token, 0))
            except ValueError:
                raise ProgramError("unknown token %r" % token)
    if stack:
        raise ProgramError("%d values left over" % len(stack))
    return assigned


def _register_name(name):
    number = name[1:]
    return CV_REGISTERS.get(int(number), name) if number.isdigit() else name


def _value(operand, values, assigned):
    if not isinstance(operand, str):
        return operand
    name = _register_name(operand)
    if name in assigned:
        return assigned[name]
    value = values.get(name)
    if callable(value):
        value = values[name] = value()
    if value is None:
        raise ProgramError("%s has no value" % operand)
    return value


def _arithmetic(operator, left, right):
    if operator == "+":
        return left + right
    if operator == "-":
        return left - right
    if operator == "*":
        return left * right
    if operator == "@":
        if right <= 0 or right & (right - 1):
            raise ProgramError("align to %d" % right)
        return left & ~(right - 1)
    if right == 0:
        raise ProgramError("division by zero")
    return left // right if operator == "/" else left % right
