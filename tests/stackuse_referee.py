"""An independent referee for x86 frame sizes: the function is executed in the
Unicorn emulator and what it really does to ESP is measured.

Nothing here uses stackuse or the compilers' figures: the image is mapped at its
preferred base, ESP points at a pushed return address, and the function runs with
its real code.  The callee of its first call always runs too (what it reads
tells its arguments); deeper callees run the first time each is reached, which
shows what each pops on return, and afterwards are skipped as if they had
returned (the corpus calls form a DAG, and this keeps every run short).  Imports
are stubs that return at once.

The frame — the quantity ``-fstack-usage`` and stackuse report — is pushes plus
allocation below the return address, without the arguments pushed for a call.
The referee reads it at the function's first ordinary call (not a stack probe:
a callee that touches the stack below its own ESP, like ``___chkstk_ms``, or
moves the caller's ESP, like ``__chkstk``): the depth of ESP below the
return-address slot there, less what the callee popped (``ret N``), less what the
function's next ESP move releases of stack it allocated only to store what the
callee read (``add esp, N`` or ``pop`` into a scratch register; an epilogue
merged into that release frees frame, which is not counted), plus what gcc takes
back at once of what the callee popped from an argument area reserved in its
frame (``sub esp, N``, or pushes of scratch registers still holding what the
callee left in them).  A function that makes no ordinary call has the deepest
ESP it reached as its frame.

A frame that realigns the stack (``and esp, -8``) depends on where ESP was on
entry, so every measurement runs under each incoming alignment (ESP = 0, 4, 8, 12
modulo 16) and gives the minimum and the maximum.  A function whose frame depends
on its argument (alloca, VLAs) is caught by running it with two arguments: any
instruction of its own that allocates different amounts makes it dynamic.
"""

import capstone

try:
    import unicorn
    from unicorn import x86_const
except ImportError:  # the tests skip with this reason
    unicorn = None

STACK_TOP = 0x00A00000
STACK_SIZE = 0x00200000
STACK_MARGIN = 0x10000
SCRATCH_SIZE = 0x00100000  # the low megabyte: small integer arguments are also valid pointers
RETURN_SENTINEL = 0x00B00000  # where the measured function returns to (mapped, never executed)
IMPORT_STUBS = 0x00C00000
ALIGNMENTS = (0, 4, 8, 12)
ARGUMENTS = (3, 100)
STACK_ARGUMENT_WORDS = 16
INSTRUCTION_BUDGET = 200000
CALLEE_SAVED_VALUES = {"ebx": 0x0B0B0B0B, "esi": 0x05050505, "edi": 0x0D0D0D0D, "ebp": 0x0E0E0E0E}
SCRATCH_REGISTERS = ("eax", "ecx", "edx")
PROBE = "probe"
PUSH_REACH = 8  # how far below ESP a push or call stores, seen before ESP moves


class Measurement(object):
    """What the execution showed of one function: ``minimum``/``maximum`` frame
    bytes over the incoming alignments (None when it could not be measured, with
    ``problem`` saying why), ``dynamic`` when the frame depends on the argument,
    and ``at_call`` when every run read it at a call (not as the deepest point of
    the one path the run took through a function that calls nothing)."""

    __slots__ = ("minimum", "maximum", "dynamic", "problem", "at_call")

    def __init__(self, minimum=None, maximum=None, dynamic=False, problem=None, at_call=False):
        self.minimum = minimum
        self.maximum = maximum
        self.dynamic = dynamic
        self.problem = problem
        self.at_call = at_call

    @property
    def padding(self):
        return None if self.minimum is None else self.maximum - self.minimum

    def __repr__(self):
        if self.dynamic:
            return "Measurement(dynamic)"
        if self.minimum is None:
            return "Measurement(problem=%r)" % self.problem
        return "Measurement(%d..%d)" % (self.minimum, self.maximum)


class _Run(object):
    """One execution's record of the measured function's own instructions."""

    def __init__(self):
        self.deepest = 0
        self.first_call = None      # depth below the return address when the first ordinary call is made
        self.callee_pops = 0        # what that callee popped on return
        self.released_after = 0     # what the function released right after it returned
        self.moves = {}             # {address of an own instruction that allocated: set of bytes allocated}
        self.problem = None


class Referee(object):
    """Executes the functions of one x86 image (a :class:`dbgext.pe.PEImage`).
    ``entries``: VAs of known function starts; a ``jmp`` to one is a tail call,
    which ends the measured function."""

    def __init__(self, image, entries=()):
        if unicorn is None:
            raise RuntimeError("unicorn is not installed")
        if image.arch != "x86":
            raise ValueError("the referee executes x86 code only")
        self.image = image
        self.entries = frozenset(entries)
        self._cs = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_32)
        self._decoded = {}
        # {callee VA: bytes it pops on return, or PROBE when it moves the caller's ESP down}
        self.callees = {}
        self._machine, self._pristine = self._build_machine()

    def _build_machine(self):
        image = self.image
        machine = unicorn.Uc(unicorn.UC_ARCH_X86, unicorn.UC_MODE_32)
        size = (image.size_of_image + 0xFFF) & ~0xFFF
        machine.mem_map(image.image_base, size)
        machine.mem_write(image.image_base, bytes(image.read_partial(0, min(0x1000, size))))
        for section in image.sections:
            machine.mem_write(image.image_base + section.rva, bytes(image.read_partial(section.rva, section.size)))
        machine.mem_map(0, SCRATCH_SIZE)
        machine.mem_map(STACK_TOP - STACK_SIZE, STACK_SIZE)
        machine.mem_map(RETURN_SENTINEL, 0x1000)
        machine.mem_map(IMPORT_STUBS, 0x1000)
        machine.mem_write(IMPORT_STUBS, b"\xc3")  # ret: every import returns at once
        for slot in image.imports:
            machine.mem_write(image.image_base + slot, IMPORT_STUBS.to_bytes(4, "little"))
        return machine, bytes(machine.mem_read(image.image_base, size))

    def _instruction(self, address):
        found = self._decoded.get(address)
        if found is None:
            code = bytes(self._machine.mem_read(address, 16))
            found = next(self._cs.disasm_lite(code, address, 1), (address, 1, "(bad)", ""))
            self._decoded[address] = found
        return found

    def measure(self, va):
        """The :class:`Measurement` of the function at ``va``."""
        frames = []
        at_call = True
        moves_by_argument = []
        for argument in ARGUMENTS:
            moves = {}
            for alignment in ALIGNMENTS:
                run = self._execute(va, argument, alignment)
                if run.problem:
                    return Measurement(problem=run.problem)
                if run.first_call is None:
                    at_call = False
                    frames.append(run.deepest)
                else:
                    frames.append(run.first_call - run.callee_pops - run.released_after)
                for address, changes in run.moves.items():
                    moves.setdefault(address, set()).update(changes)
            moves_by_argument.append(moves)
        first, second = moves_by_argument
        if any(first[address] != second[address] for address in set(first) & set(second)):
            return Measurement(dynamic=True)
        return Measurement(min(frames), max(frames), at_call=at_call)

    def depth_reaching(self, va, stop, zero_flag=False):
        """ESP's depth below the return address when execution from ``va`` first
        reaches ``stop`` (callees run, imports return at once; EFLAGS' ZF as
        given), or None when it does not within the instruction budget."""
        machine = self._machine
        machine.mem_write(self.image.image_base, self._pristine)
        return_slot = STACK_TOP - 0x10000
        machine.mem_write(return_slot, RETURN_SENTINEL.to_bytes(4, "little"))
        for name, value in CALLEE_SAVED_VALUES.items():
            machine.reg_write(_register(name), value)
        for name in SCRATCH_REGISTERS:
            machine.reg_write(_register(name), ARGUMENTS[0])
        machine.reg_write(ESP, return_slot)
        machine.reg_write(x86_const.UC_X86_REG_EFLAGS, 0x2 | (0x40 if zero_flag else 0))
        machine.reg_write(EIP, va)
        if stop != va:
            try:
                machine.emu_start(va, stop, count=INSTRUCTION_BUDGET)
            except unicorn.UcError:
                return None
        if machine.reg_read(EIP) != stop:
            return None
        return return_slot - machine.reg_read(ESP)

    def _execute(self, va, argument, alignment):
        machine = self._machine
        machine.mem_write(self.image.image_base, self._pristine)
        return_slot = STACK_TOP - 0x10000 - alignment
        machine.mem_write(return_slot, RETURN_SENTINEL.to_bytes(4, "little"))
        for index in range(STACK_ARGUMENT_WORDS):
            machine.mem_write(return_slot + 4 + 4 * index, argument.to_bytes(4, "little"))
        for name, value in CALLEE_SAVED_VALUES.items():
            machine.reg_write(_register(name), value)
        for name in SCRATCH_REGISTERS:
            machine.reg_write(_register(name), argument)
        machine.reg_write(ESP, return_slot)
        run = _Run()
        # Calls in progress below the measured function, innermost last:
        # [return address, ESP before the call, callee VA (None until entered)].
        calls = []
        # The measured function's previous instruction: (address, mnemonic, operands, ESP before it).
        previous = [None]
        watching_release = [False]
        # Stack slots the measured function itself wrote, and those it read back.
        own_writes, own_reads = set(), set()
        callee_reads = set()
        # {slot: (lowest, end) of the own instruction's allocation that made it}
        allocations = {}
        releasable = [0]
        scratch_at_return = {}
        skipped = [False]
        retaken = [0]  # bytes of what the first callee popped taken back by pushes so far

        def returned(sp, callee):
            # Back in the measured function from a call (ESP ``sp``).
            if self.callees.get(callee) == PROBE or run.first_call is not None:
                return
            caller_sp = previous[0][3]
            scratch_at_return.update((name, machine.reg_read(_register(name))) for name in ("ecx", "edx"))
            run.first_call = return_slot - caller_sp
            run.callee_pops = sp - caller_sp
            watching_release[0] = True

        def on_code(uc, address, size, _):
            sp = uc.reg_read(ESP)
            if calls and calls[-1][2] is None:
                calls[-1][2] = address
                pops = self.callees.get(address)
                # The first call's callee always runs: what it reads tells its arguments.
                if pops is not None and pops != PROBE and (run.first_call is not None or len(calls) > 1):
                    # A callee seen before: return from it at once.
                    return_address, caller_sp, _ = calls.pop()
                    uc.reg_write(ESP, caller_sp + pops)
                    uc.reg_write(EIP, return_address)
                    skipped[0] = True
                    if not calls:
                        returned(caller_sp + pops, address)
                    return
            if address == RETURN_SENTINEL:
                uc.emu_stop()
                return
            if address == IMPORT_STUBS and len(calls) == 1 and run.first_call is None:
                # The first callee is an import (or a thunk jumping to one): what
                # it would read and pop is unknown.
                run.problem = "its first call goes to an import, whose arguments are unknown"
                uc.emu_stop()
                return
            if skipped[0]:
                # Back from a skipped call (a recursive one returns to the same
                # address as its caller's call: that one has not returned).
                skipped[0] = False
            elif calls and address == calls[-1][0]:
                return_address, caller_sp, callee = calls.pop()
                pops = sp - caller_sp
                if callee is not None and self.callees.get(callee) != PROBE:
                    self.callees[callee] = PROBE if pops < 0 else pops
                if not calls:
                    returned(sp, callee)
            _, _, mnemonic, operands = self._instruction(address)
            if calls:
                if mnemonic == "call":
                    calls.append([address + size, sp, None])
                return
            # One of the measured function's own instructions.
            if previous[0] is not None:
                last_address, last_mnemonic, last_operands, last_sp = previous[0]
                if sp < last_sp:
                    # What each instruction allocates (releases restore ESP from a
                    # frame pointer by however far the realignment moved it).
                    # Realignment moves ESP by where it was, not by the code: not a size.
                    run.moves.setdefault(last_address, set()).add(0 if last_mnemonic == "and" else last_sp - sp)
                if sp < last_sp and last_mnemonic != "call":
                    for slot in range(sp, last_sp, 4):
                        allocations[slot] = (sp, last_sp)
                if watching_release[0] and last_mnemonic != "call" and sp != last_sp:
                    # The first instruction after the call that moves ESP.
                    watching_release[0] = False
                    moved = sp - last_sp
                    pushed = int.from_bytes(bytes(uc.mem_read(sp, 4)), "little")
                    if (last_mnemonic == "add" and last_operands.startswith("esp, ")) or (
                            last_mnemonic == "pop" and last_operands in SCRATCH_REGISTERS):
                        # Released after the call: arguments only as far as they were
                        # allocated for the callee, and only when it read them (the
                        # rest is the frame, freed by an epilogue merged in).
                        released = min(moved, releasable[0])
                        if any(slot in callee_reads for slot in range(last_sp, last_sp + released, 4)):
                            run.released_after = released
                    elif moved == -run.callee_pops and last_mnemonic == "sub" and last_operands.startswith("esp, "):
                        # gcc takes back exactly what a callee popped from the
                        # argument area reserved in its frame.
                        run.released_after = moved
                    elif last_mnemonic == "push" and scratch_at_return.get(last_operands) == pushed and (
                            retaken[0] - moved <= run.callee_pops):
                        # The same with pushes (gcc -Os), told from the next call's
                        # arguments by what they push: a scratch register still
                        # holding what the callee left in it.
                        retaken[0] -= moved
                        if retaken[0] == run.callee_pops:
                            run.released_after = -retaken[0]
                        else:
                            watching_release[0] = True
            if watching_release[0] and previous[0][1] == "call" and mnemonic == "call":
                watching_release[0] = False  # the next call came first: nothing was released
            elif watching_release[0] and previous[0][1] == "call":
                # Back from the first call: how far up from here the stack holds
                # allocations (pushes, subs) made only to store what the callee
                # gets: every slot written by the function and never read back by
                # it.  A reserved argument area in the frame (gcc) shares its
                # allocation with locals or padding, so it does not qualify.
                slot = sp
                while slot < return_slot and allocations.get(slot, (None,))[0] == slot and all(
                        word in own_writes and word not in own_reads for word in range(*allocations[slot], 4)):
                    slot = allocations[slot][1]
                releasable[0] = slot - sp
            depth = return_slot - sp
            run.deepest = max(run.deepest, depth)
            previous[0] = (address, mnemonic, operands, sp)
            if mnemonic == "call":
                calls.append([address + size, sp, None])
            elif mnemonic == "jmp" and depth == 0 and _direct_target(operands) in self.entries:
                uc.emu_stop()  # a tail call: the measured function's frame is gone

        def on_memory(uc, access, address, size, value, _):
            # A callee that touches the stack below its own ESP is a stack probe
            # (nothing below ESP is valid on Windows): it is part of the allocation.
            # The hook sees a push's store before ESP moves: that one is not below.
            if not calls:
                for slot in range(address & ~3, address + size, 4):
                    (own_writes if access == unicorn.UC_MEM_WRITE else own_reads).add(slot)
                return
            if access == unicorn.UC_MEM_READ and len(calls) == 1:
                callee_reads.update(range(address & ~3, address + size, 4))
            if calls[-1][2] is not None and address + size <= uc.reg_read(ESP) - PUSH_REACH:
                self.callees[calls[-1][2]] = PROBE

        hooks = [machine.hook_add(unicorn.UC_HOOK_CODE, on_code),
                 machine.hook_add(unicorn.UC_HOOK_MEM_READ | unicorn.UC_HOOK_MEM_WRITE, on_memory,
                                  begin=STACK_TOP - STACK_SIZE, end=STACK_TOP - 1)]
        try:
            machine.emu_start(va, RETURN_SENTINEL, count=INSTRUCTION_BUDGET)
        except unicorn.UcError as error:
            if machine.reg_read(ESP) < STACK_TOP - STACK_SIZE + STACK_MARGIN:
                run.problem = "ran out of its %d KB stack (unbounded recursion)" % (STACK_SIZE // 1024)
            else:
                run.problem = "%s at 0x%x" % (error, machine.reg_read(EIP))
        finally:
            for hook in hooks:
                machine.hook_del(hook)
        stopped_at = machine.reg_read(EIP)
        if run.problem is None and run.first_call is None and stopped_at != RETURN_SENTINEL and not (
                self._instruction(stopped_at)[2] == "jmp"):
            run.problem = "did not return within %d instructions" % INSTRUCTION_BUDGET
        return run


def _register(name):
    return getattr(x86_const, "UC_X86_REG_" + name.upper())


if unicorn is not None:
    ESP, EIP = x86_const.UC_X86_REG_ESP, x86_const.UC_X86_REG_EIP


def _direct_target(operands):
    try:
        return int(operands, 0)
    except ValueError:
        return None
