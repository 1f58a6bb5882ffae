"""The stack walk: frame 0 from the thread's context, then one frame at a time with
the best method that applies — x64 and ARM64 unwind data (RtlVirtualUnwind's
semantics), the frame-pointer chain (x86 EBP; x64 RBP and ARM64's x29/x30 frame
record in a module without unwind data) — and a scan of the stack only where
neither applies.

Every walk is bounded (``max_frames``, a bounded scan per frame), stops on a loop
(a stack pointer that does not grow without a machine frame to explain it, or a
frame seen before) and turns unreadable memory into a Problem with its address.
A walk that ends with return address 0 while the stack above still holds a
return address is reported (it may have ended early), and so, once, are the
modules whose missing images made frames less certain, with what would help.
"""

from ..errors import UnreadableMemory
from ..problems import ProblemLog
from ..target.base import POINTER_REGISTERS
from . import arm64_unwind
from .images import Images
from ..symbols.framedata import read_frame_table
from ..symbols.pdb import PdbError
from ..winpath import file_name
from .result import Frame, StackResult, Step
from .scan import ReturnAddresses, scan_for_return
from .threads import selected_thread, stack_bounds, trap_frame_of, waiting_kernel_thread
from .x64 import UnwindError, unwind_function, unwind_leaf
from .x86 import unwind_at_entry, unwind_frame_chain, unwind_frame_data

MAX_FRAMES = 256
ARGUMENT_SLOTS = 4    # kv's "Args to Child"
ARGUMENTS_READ_LIMIT = 0x10000  # frames spanning more (a machine frame onto another stack) are read one by one
STACK_SPAN_GUESS = 1 << 20  # how far above the context's SP a scan may look when the bounds are unknown

SWITCH_FRAME_SOURCE = "KTHREAD switch frame"  # thread_source of a waiting kernel thread's walk


def analyze(target, thread=None, max_frames=MAX_FRAMES, image_loader=None):
    """The :class:`StackResult` of ``thread``: None for the target's selected
    (crashing/current) thread, a :class:`~dbgext.target.base.Thread`, or a KTHREAD
    address (int) of a kernel thread.  ``image_loader(module)`` -> PEImage or None
    supplies images the target lacks (see :mod:`dbgext.stacks.images`)."""
    return Unwinder(target, image_loader).walk(thread, max_frames)


class Unwinder(object):
    """Walks threads of one target; modules' unwind data is loaded once and kept
    across walks (triage and benchmarks walk many threads of one target), so a
    problem with a module's image is reported by the walk that first needed it."""

    def __init__(self, target, image_loader=None):
        self.target = target
        self.pointer_size = target.pointer_size
        self.ip_name, self.sp_name = POINTER_REGISTERS[target.arch]
        self.kernel = (target.info() or {}).get("mode") == "kernel"
        self.image_loader = image_loader
        self._images = None
        self._returns = None
        self._frame_tables = {}  # module base -> its PDB's FrameTable (x86), or None

    def walk(self, thread=None, max_frames=MAX_FRAMES):
        target = self.target
        result = StackResult(target.arch, self.pointer_size)
        # Problems met loading images belong to the walk that met them.
        self.images.problems = result.problems
        chosen = self._choose(thread, result)
        if chosen is not None:
            self._describe_thread(chosen, result)
            self._walk(chosen.registers, result, max(1, max_frames))
            self._report_missing_images(result.frames, result.problems)
            self._fill_arguments(result.frames)
        result.problems.finish()
        return result

    @property
    def images(self):
        if self._images is None:
            self._images = Images(self.target, None, self.image_loader)
            self._returns = ReturnAddresses(self.target, self._images, self._inside_function)
        return self._images

    # -- the thread -------------------------------------------------------------------------

    def _choose(self, thread, result):
        target = self.target
        if thread is None:
            chosen = selected_thread(target, result.problems)
            if chosen is None:
                result.problems.add("no_context", None, "the target holds no register context: no thread to walk")
                return None
            result.thread_source = chosen.name or "current thread"
            return chosen
        if isinstance(thread, int):
            current = selected_thread(target, ProblemLog())
            if current is not None and current.kernel_thread == thread:
                result.thread_source = current.name or "current thread"
                return current
            chosen = waiting_kernel_thread(target, thread, result.problems)
            result.thread_source = SWITCH_FRAME_SOURCE
            return chosen
        result.thread_source = thread.name or "thread %s" % thread.id
        return thread

    def _describe_thread(self, thread, result):
        result.thread_id = thread.id
        result.kernel_thread = thread.kernel_thread
        result.stack_base, result.stack_limit = thread.stack_base, thread.stack_limit
        if thread.kernel_thread is not None and result.stack_base is None:
            bounds = stack_bounds(self.target, thread.kernel_thread, result.problems)
            result.stack_base, result.stack_limit = bounds.get("InitialStack"), bounds.get("StackLimit")

    # -- the walk ---------------------------------------------------------------------------

    def _walk(self, registers, result, max_frames):
        registers = dict((str(name).lower(), value) for name, value in registers.items() if isinstance(value, int))
        ip, sp = registers.get(self.ip_name), registers.get(self.sp_name)
        if ip is None or sp is None:
            result.problems.add("no_context", None, "the thread's context has no %s/%s" % (self.ip_name, self.sp_name))
            return
        known = result.stack_base is not None and result.stack_limit is not None
        bounds = (result.stack_limit, result.stack_base) if known else None
        if bounds and not bounds[0] <= sp <= bounds[1]:
            result.problems.add("sp_outside_stack", sp, "the stack pointer lies outside the thread's stack "
                                "%s-%s" % (self.target.format_address(bounds[0]),
                                           self.target.format_address(bounds[1])))
            bounds = None
        found_by, unconfirmed, callee_parameters = "context", False, 0
        # ARM64: the pc is a return address (the call is the instruction before it)
        # in every frame but the first and those a trap or machine frame resumes.
        unwound_to_call = False
        seen = set()
        frames = result.frames
        while True:
            if len(frames) >= max_frames:
                result.truncated = True
                result.problems.add("frames_truncated", sp, "stopped after %d frames" % max_frames, "note")
                return
            module = self.images.module_at(ip)
            frame = Frame(len(frames), sp, ip, found_by, module.name if module else None,
                          self.target.symbolize(ip), registers.get("ebp") if self.target.arch == "x86" else None)
            frame.unconfirmed = unconfirmed
            if frames:
                frame.memory = sp - frames[-1].child_sp
            frames.append(frame)
            seen.add((ip, sp))
            step = self._step(frame, module, registers, result.problems, bounds, callee_parameters,
                              unwound_to_call)
            if step is None:
                return
            caller, how, slot, machine_frame, confirmed, callee_parameters, to_call = step
            frame.return_address, frame.return_slot = caller[self.ip_name], slot
            frame.machine_frame = machine_frame
            if machine_frame is not None and self.kernel:
                frame.trap_frame = trap_frame_of(self.target, machine_frame, slot)
            new_ip, new_sp = caller[self.ip_name], caller[self.sp_name]
            if new_ip == 0:
                # The thread's first frame, nothing called it: unless the stack goes on.
                self._check_end(frame, new_sp, bounds, result.problems)
                return
            # An ARM64 leaf returns through lr without moving sp.
            if machine_frame is None and (new_sp < sp or new_sp == sp and self.target.arch != "arm64"):
                result.problems.add("stack_not_increasing", sp, "unwinding %s gave a stack pointer %s that is not "
                                    "above the frame's: walk stopped" % (frame.function,
                                                                           self.target.format_address(new_sp)))
                return
            if (new_ip, new_sp) in seen:
                result.problems.add("unwind_loop", new_sp, "the walk returns to a frame it has seen: stopped")
                return
            if machine_frame is not None:
                bounds = None  # interrupted code may run on another stack (user, DPC, ISR)
            elif bounds and not bounds[0] <= new_sp <= bounds[1]:
                result.problems.add("sp_outside_stack", new_sp, "unwinding %s leaves the thread's stack: walk "
                                    "stopped" % frame.function)
                return
            registers, ip, sp, found_by, unconfirmed = caller, new_ip, new_sp, how, not confirmed
            unwound_to_call = to_call and machine_frame is None

    def _step(self, frame, module, registers, problems, bounds, callee_parameters, unwound_to_call):
        """The :class:`~dbgext.stacks.result.Step` to the caller, or None."""
        target = self.target
        step = None
        try:
            if target.arch == "x64" and module is not None:
                step = self._unwind_x64(module, registers, problems, frame)
                if step is None and not self.images.code_for(module).has_unwind_data:
                    step = unwind_frame_chain(target, registers, frame.index == 0, self._returns, bounds,
                                              self._code_at)
            elif target.arch == "x86" and (module is not None or frame.index == 0):
                if module is not None:
                    step = self._unwind_x86(module, registers, problems, frame, bounds, callee_parameters)
                if step is None:
                    step = unwind_frame_chain(target, registers, frame.index == 0, self._returns, bounds,
                                              self._code_at)
            elif target.arch == "arm64" and module is not None:
                step = self._unwind_arm64(module, registers, problems, frame, bounds, unwound_to_call)
        except UnreadableMemory as error:
            problems.add("stack_unreadable", error.address, "unwinding %s needs stack memory at %s that is "
                         "unreadable" % (frame.function, target.format_address(error.address)))
            return None
        if step is not None:
            return step
        if module is None and frame.index > 0:
            problems.add("outside_modules", frame.ip, "the return address %s is in no loaded module: walk stopped"
                         % target.format_address(frame.ip), "note")
            return None
        return self._scan(frame, registers, problems, bounds)

    def _unwind_x64(self, module, registers, problems, frame):
        """The step by the module's unwind data, or None where it has none to trust."""
        code = self.images.code_for(module)
        if not code.has_unwind_data:
            return None
        rva = registers["rip"] - module.base
        entry = code.function_entry(rva)
        read = self.target.pointer
        if entry is None:
            if code.corrupt:
                return None  # its entry may be one of those dropped: not evidence of a leaf
            step = unwind_leaf(registers, read)
            return Step(step.registers, "unwind", step.return_slot, None, True, 0)
        try:
            step = unwind_function(code.image, module.base, entry, registers, read, code.code_window(rva),
                                   code.info_cache)
        except UnwindError as error:
            problems.add(error.kind, error.address, "%s: %s" % (frame.function, error))
            return None
        return Step(step.registers, "unwind", step.return_slot, step.machine_frame, True, 0)

    def _unwind_x86(self, module, registers, problems, frame, bounds, callee_parameters):
        """The step by the FPO/FrameData record of the module's PDB covering EIP, or None."""
        table = self._frame_table(module, problems)
        rva = registers["eip"] - module.base
        record = table.find(rva) if table is not None else None
        if record is None:
            # No record here: in frame 0, a function's first instruction or a linker thunk.
            if table is not None and frame.index == 0:
                return unwind_at_entry(self.target, registers, self._returns, rva in table.function_starts,
                                       not table.inside_function(rva), self._code_at)
            return None
        return unwind_frame_data(self.target, record, rva - record.rva, registers, frame.index == 0,
                                 self._returns, callee_parameters, bounds)

    def _inside_function(self, module, rva):
        """Whether the module's PDB (its frame table, once loaded) puts ``rva``
        inside a function; None when there is no table."""
        table = self._frame_tables.get(module.base)
        return table.inside_function(rva) if table is not None else None

    def _frame_table(self, module, problems):
        if module.base not in self._frame_tables:
            self._frame_tables[module.base] = None
            symbols = self.target.symbols.module_symbols(module.name)
            pdb = getattr(symbols, "pdb", None)
            if pdb is not None:
                try:
                    self._frame_tables[module.base] = read_frame_table(pdb)
                except PdbError as error:
                    problems.add("frame_data_unreadable", module.base, str(error), "warning")
        return self._frame_tables[module.base]

    def _code_at(self, address, size):
        """Code the target lacks, from the image file of the module holding it."""
        module = self.images.module_at(address)
        return self.images.code_for(module).code(address - module.base, size) if module else b""

    def _unwind_arm64(self, module, registers, problems, frame, bounds, unwound_to_call):
        """The step by the module's ``.pdata``/``.xdata`` (a function without an
        entry is a leaf: lr holds its return address), by the x29/x30 frame
        record where the module has no unwind data, or None."""
        code = self.images.code_for(module)
        read = self.target.pointer
        if not code.has_unwind_data:
            step = arm64_unwind.unwind_frame_chain(registers, read)
            if step is None or (bounds and not bounds[0] <= step.registers["sp"] <= bounds[1]):
                return None
            # Return address 0 in a chain that holds so far: the thread's first frame.
            pc = step.registers["pc"]
            verdict = True if pc == 0 else self._returns.verdict(pc)
            if verdict is False:
                return None
            return Step(step.registers, "frame_chain", step.return_slot, None, verdict is True, 0)
        pc = registers["pc"]
        entry = code.function_entry(pc - module.base - (arm64_unwind.INSTRUCTION_SIZE if unwound_to_call else 0))
        try:
            if entry is None:
                if code.corrupt:
                    return None  # its entry may be one of those dropped: not evidence of a leaf
                step = arm64_unwind.unwind_leaf(registers)
            else:
                step = arm64_unwind.unwind_function(code.image, module.base, entry, registers, read,
                                                    unwound_to_call, code.info_cache)
        except UnwindError as error:
            problems.add(error.kind, error.address, "%s: %s" % (frame.function, error))
            return None
        return Step(step.registers, "unwind", step.return_slot, step.machine_frame, True, 0, step.unwound_to_call)

    def _scan(self, frame, registers, problems, bounds):
        top = bounds[1] if bounds else frame.child_sp + STACK_SPAN_GUESS
        found = scan_for_return(self.target, self._returns, frame.child_sp, top, self.pointer_size)
        if found is None:
            problems.add("no_return_address", frame.child_sp, "no return address found by scanning above %s: "
                         "walk ended" % self.target.format_address(frame.child_sp), "warning")
            return None
        slot, value, confirmed = found
        caller = dict(registers)
        caller[self.ip_name], caller[self.sp_name] = value, slot + self.pointer_size
        return Step(caller, "scan", slot, None, confirmed, 0)

    def _check_end(self, frame, sp, bounds, problems):
        """Return address 0 ends a walk quietly only where the stack ends too: a
        confirmed return address above ``sp`` says the unwind went wrong."""
        if bounds is None:
            return
        found = scan_for_return(self.target, self._returns, sp, bounds[1], self.pointer_size, confirmed_only=True)
        if found is not None:
            slot, value, _ = found
            problems.add("walk_ended_early", sp, "unwinding %s gave return address 0, but the stack above holds "
                         "a return address into %s at %s: the walk may have ended early"
                         % (frame.function, self.target.symbolize(value), self.target.format_address(slot)),
                         "warning")

    def _report_missing_images(self, frames, problems):
        """One problem naming the modules whose frames lacked unwind data (x64) or
        code to confirm them (x86), and what would supply it."""
        names = []
        x64 = self.target.arch in ("x64", "arm64")   # architectures whose images carry unwind data
        for frame in frames:
            module = self.images.module_at(frame.ip)
            if module is not None and (self.images.lacks_unwind_data(module) if x64 else frame.unconfirmed):
                name = file_name(module.image)
                if name not in names:
                    names.append(name)
        if not names:
            return
        what = "no unwind data for" if x64 else "no code to confirm the frames of"
        problems.add("no_unwind_data", None, "%s %s: give --image-path or a symbol path with the image store"
                     % (what, ", ".join(names)), "warning")

    def _fill_arguments(self, frames):
        """Each frame's stack slots just above its return address (kv's Args to
        Child), from one read of the stack the frames span where it is compact.
        None on ARM64: arguments travel in x0-x7, and no stack slots above the
        saved lr belong to the callee."""
        if self.target.arch == "arm64":
            return
        size = self.pointer_size
        slots = [frame.return_slot for frame in frames if frame.return_slot is not None]
        if not slots:
            return
        low, high = min(slots) + size, max(slots) + size * (ARGUMENT_SLOTS + 1)
        whole = self.target.try_read(low, high - low) if high - low <= ARGUMENTS_READ_LIMIT else None
        for frame in frames:
            if frame.return_slot is None:
                continue
            start = frame.return_slot + size
            read = whole or self.target.try_read(start, ARGUMENT_SLOTS * size)
            frame.arguments = [int.from_bytes(read.data[at - read.address:at - read.address + size], "little")
                               if read.readable(at, size) else None
                               for at in range(start, start + ARGUMENT_SLOTS * size, size)]
