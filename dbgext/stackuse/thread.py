"""A ``kf``-like view of one kernel thread's stack: every frame's actual stack use
(distance between consecutive child-SPs) next to the static estimate, the thread's
bounds from ``_KTHREAD`` and what is left.

The walk unwinds with the stack analysis itself: for the function containing RIP
it knows the SP depth at that very instruction, so the return address is at
RSP + depth.  Where no function is known (code not in any module, unreadable
code) it scans the stack upward for the next value that is a return address (it
points just after a call instruction in a loaded module), as one would with
``dps``, and marks the frame as found by scanning.
"""

from ..errors import BadInput, UnreadableMemory
from .callgraph import depths_in
from .layouts import (KPRCB_CURRENT_THREAD, KPRCB_TYPE, KTHREAD_STACK_FIELDS, KTHREAD_TYPE,
                      PROCESSOR_BLOCK_SYMBOL, SWITCH_FRAME_RETURN_OFFSET)

MAX_FRAMES = 256
MAX_SCAN_SLOTS = 2048
MAX_STACK_SPAN = 1024 * 1024


class StackFrame(object):
    __slots__ = ("index", "child_sp", "instruction", "function", "frame_size", "uses", "how")

    def __init__(self, index, child_sp, instruction, function, frame_size, how):
        self.index = index
        self.child_sp = child_sp
        self.instruction = instruction   # RIP (frame 0) or the return address into it
        self.function = function         # "module!name+0x.." text
        self.frame_size = frame_size     # static estimate: frame size, or None
        self.uses = None                 # actual bytes: next child-SP minus this one
        self.how = how                   # "unwound" | "scanned" | "context"


class ThreadStack(object):
    def __init__(self):
        self.thread = None
        self.thread_source = None     # how the thread was chosen
        self.initial_stack = None
        self.stack_limit = None
        self.kernel_stack = None
        self.rsp = None
        self.frames = []
        self.problems = []
        self.threshold = None
        self.pointer_size = 8

    @property
    def used(self):
        if self.initial_stack is None or self.rsp is None:
            return None
        return self.initial_stack - self.rsp

    @property
    def remaining(self):
        if self.stack_limit is None or self.rsp is None:
            return None
        return self.rsp - self.stack_limit

    def hogs(self):
        if self.threshold is None:
            return []
        return [frame for frame in self.frames if frame.uses is not None and frame.uses >= self.threshold]


def _register(registers, name):
    for key, value in (registers or {}).items():
        if key.lower() == name:
            return value
    return None


def current_thread(target, problems):
    """nt!KiProcessorBlock[processor] -> _KPRCB.CurrentThread, via type information."""
    block = target.symbol_address(PROCESSOR_BLOCK_SYMBOL)
    offset = target.field_offset(KPRCB_TYPE, KPRCB_CURRENT_THREAD)
    if block is None or offset is None:
        problems.append("no %s / %s.%s in the symbols: the current thread's KTHREAD is unknown"
                        % (PROCESSOR_BLOCK_SYMBOL, KPRCB_TYPE, KPRCB_CURRENT_THREAD))
        return None
    processor = target.info().get("processor") or 0
    try:
        prcb = target.pointer(block + processor * target.pointer_size)
        return target.pointer(prcb + offset)
    except UnreadableMemory as error:
        problems.append("cannot read the current thread: %s" % error)
        return None


def walk_thread(target, program, graph, thread=None, threshold=None):
    """The :class:`ThreadStack` of ``thread`` (a KTHREAD address), or of the
    current thread (the dump's context registers) when ``thread`` is None."""
    result = ThreadStack()
    result.pointer_size = target.pointer_size
    result.threshold = threshold
    registers = target.info().get("registers") or {}
    sp_name, ip_name = ("rsp", "rip") if target.arch == "x64" else ("esp", "eip")
    if thread is None:
        result.thread = current_thread(target, result.problems)
        result.thread_source = "current thread (context registers; KTHREAD from %s)" % PROCESSOR_BLOCK_SYMBOL
    else:
        result.thread = thread
        result.thread_source = "given"
    if result.thread is not None:
        _read_bounds(target, result)
    current = thread is None or (result.thread is not None and result.thread == current_thread(target, []))
    if current:
        rsp, rip = _register(registers, sp_name), _register(registers, ip_name)
        if rsp is None or rip is None:
            raise BadInput("the target has no context registers (%s/%s) for the current thread" % (ip_name, sp_name))
        frames_from = (rip, rsp, "context")
    else:
        if result.kernel_stack is None:
            raise BadInput("the stack of thread 0x%x is unknown (no KernelStack)" % thread)
        slot = result.kernel_stack + SWITCH_FRAME_RETURN_OFFSET[target.arch]
        try:
            rip = target.pointer(slot)
        except UnreadableMemory as error:
            raise BadInput("cannot read the switch frame of thread 0x%x: %s" % (thread, error))
        frames_from = (rip, slot + target.pointer_size, "switch frame")
        rsp = result.kernel_stack
    result.rsp = rsp
    _unwind(target, program, graph, result, *frames_from)
    return result


def _read_bounds(target, result):
    values = {}
    for field in KTHREAD_STACK_FIELDS:
        offset = target.field_offset(KTHREAD_TYPE, field)
        if offset is None:
            result.problems.append("no type information for %s.%s" % (KTHREAD_TYPE, field))
            continue
        try:
            values[field] = target.pointer(result.thread + offset)
        except UnreadableMemory as error:
            result.problems.append("%s.%s unreadable: %s" % (KTHREAD_TYPE, field, error))
    result.initial_stack = values.get("InitialStack")
    result.stack_limit = values.get("StackLimit")
    result.kernel_stack = values.get("KernelStack")


def _unwind(target, program, graph, result, rip, rsp, first_how):
    pointer = target.pointer_size
    top = result.initial_stack if result.initial_stack else rsp + MAX_STACK_SPAN
    seen = set()
    how = first_how
    depth_cache = {}
    while len(result.frames) < MAX_FRAMES:
        if (rip, rsp) in seen:
            result.problems.append("the walk loops at child-SP 0x%x" % rsp)
            break
        seen.add((rip, rsp))
        function = _function_at(program, rip)
        if function is not None:
            graph.analyse(function)
        frame = StackFrame(len(result.frames), rsp, rip, target.symbolize(rip),
                           function.frame_size if function is not None else None, how)
        if function is not None:
            frame.function = _describe(target, function, rip)
        result.frames.append(frame)
        depth = None
        if function is not None:
            depths = depth_cache.get(function.va)
            if depths is None:
                depths = depth_cache[function.va] = _frame_depths(program, function)
            depth = depths.get(rip)
        if depth is not None:
            slot = rsp + depth
            how = "unwound"
        else:
            slot = _scan_for_return(target, program, rsp, top)
            how = "scanned"
            if slot is None:
                result.problems.append("no return address found above child-SP 0x%x (%s): walk ended"
                                       % (rsp, frame.function))
                break
        try:
            return_address = target.pointer(slot)
        except UnreadableMemory as error:
            result.problems.append("stack unreadable at 0x%x: %s" % (slot, error))
            break
        next_sp = slot + pointer
        frame.uses = next_sp - rsp
        if return_address == 0 or next_sp >= top or target.module_at(return_address) is None:
            break
        rip, rsp = return_address, next_sp
    else:
        result.problems.append("more than %d frames: walk stopped" % MAX_FRAMES)


def _frame_depths(program, function):
    """{address: SP depth} for unwinding from ``address`` in ``function``.

    A return address is unwound with the depth *at its call*: the callee has not
    returned yet, so arguments it will pop itself (x86 stdcall) are still there."""
    depths = depths_in(program, function)
    decoder = function.module.decoder
    for site in function.call_sites:
        if site.kind in ("call", "indirect"):
            insn = decoder.at(site.address)
            if insn is not None:
                depths[site.address + insn[1]] = site.depth
    return depths


def _function_at(program, address):
    module = program.module_for(address)
    if module is None:
        return None
    function = module.function_containing(address)
    if function is not None and function.fragment_of is not None:
        function = module.functions.get(function.fragment_of, function)
    return function


def _describe(target, function, address):
    offset = address - function.va
    base = "%s!%s" % (function.module.name, function.name) if function.name else target.symbolize(function.va)
    return base if offset == 0 else "%s+0x%x" % (base, offset)


def _scan_for_return(target, program, rsp, top):
    """The first stack slot at or above ``rsp`` holding an address just after a call
    instruction in a loaded module's code."""
    pointer = target.pointer_size
    span = min(MAX_SCAN_SLOTS * pointer, max(0, top - rsp))
    read = target.try_read(rsp, span)
    for offset in range(0, span - pointer + 1, pointer):
        if not read.readable(rsp + offset, pointer):
            continue
        value = int.from_bytes(read.data[offset:offset + pointer], "little")
        if value and _follows_call(target, program, value):
            return rsp + offset
    return None


def _follows_call(target, program, address):
    module = program.module_for(address)
    if module is None or not module.image.is_code(address - module.image.image_base):
        return False
    for length in (5, 6, 2, 3, 7):
        insn = module.decoder.at(address - length)
        if insn is not None and insn[1] == length and insn[2] == "call":
            return True
    return False
