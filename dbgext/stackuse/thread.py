"""A ``kf``-like view of one kernel thread's stack: every frame's actual stack use
(distance between consecutive child-SPs) next to the static estimate, the thread's
bounds from ``_KTHREAD`` and what is left.

The frames are the unwinder's (:mod:`dbgext.stacks`: unwind data, frame chains,
a scan only as the last resort, each frame saying which); this module adds the
static frame-size estimates of the stack analysis and the thread's budget.
"""

from .. import stacks
from ..errors import BadInput
from ..problems import ProblemLog
from ..stacks.threads import stack_bounds
from ..stacks.walk import SWITCH_FRAME_SOURCE

SCHEMA_VERSION = 1


class StackFrame(object):
    __slots__ = ("index", "child_sp", "instruction", "function", "frame_size", "uses", "how")

    def __init__(self, index, child_sp, instruction, function, frame_size, uses, how):
        self.index = index
        self.child_sp = child_sp
        self.instruction = instruction   # RIP (frame 0) or the return address into it
        self.function = function         # "module!name+0x.." text
        self.frame_size = frame_size     # static estimate: frame size, or None
        self.uses = uses                 # actual bytes: next child-SP minus this one
        self.how = how                   # dbgext.stacks.FOUND_BY: context | unwind | frame_chain | scan


class ThreadStack(object):
    def __init__(self):
        self.thread = None
        self.thread_source = None     # how the thread was chosen
        self.initial_stack = None
        self.stack_limit = None
        self.kernel_stack = None
        self.rsp = None
        self.frames = []
        self.problems = ProblemLog()
        self.threshold = None
        self.pointer_size = 8
        self.return_address_size = 8    # what a call pushes: 0 on ARM64 (bl leaves it in lr)

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

    def estimate(self, frame):
        """The stack a frame's function uses by its static frame size (the
        return address a call pushed included), or None."""
        return None if frame.frame_size is None else frame.frame_size + self.return_address_size

    def hogs(self):
        if self.threshold is None:
            return []
        return [frame for frame in self.frames if frame.uses is not None and frame.uses >= self.threshold]

    def as_dict(self):
        """The ``stackuse thread --json`` document."""
        hogs = self.hogs()
        return {
            "schema_version": SCHEMA_VERSION,
            "thread": self.thread,
            "thread_source": self.thread_source,
            "initial_stack": self.initial_stack,
            "stack_limit": self.stack_limit,
            "kernel_stack": self.kernel_stack,
            "sp": self.rsp,
            "used": self.used,
            "remaining": self.remaining,
            "threshold": self.threshold,
            "frames": [{
                "index": frame.index, "child_sp": frame.child_sp, "instruction": frame.instruction,
                "function": frame.function, "uses": frame.uses, "frame_size": frame.frame_size,
                "estimate": self.estimate(frame),
                "how": frame.how,
                "over_threshold": frame in hogs,
            } for frame in self.frames],
            "problems": self.problems.as_list(),
        }


def walk_thread(target, program, graph, thread=None, threshold=None):
    """The :class:`ThreadStack` of ``thread`` (a KTHREAD address), or of the
    current thread (the target's context registers) when ``thread`` is None.
    Raises BadInput when not even one frame can be found (no context, an
    unreadable KTHREAD or switch frame)."""
    result = ThreadStack()
    result.pointer_size = target.pointer_size
    result.return_address_size = 0 if target.arch == "arm64" else target.pointer_size
    result.threshold = threshold
    walked = stacks.analyze(target, thread=thread)
    waiting = walked.thread_source == SWITCH_FRAME_SOURCE
    if not walked.frames:
        raise BadInput("; ".join(problem.message for problem in walked.problems) or "no frames")
    result.thread = walked.kernel_thread
    result.thread_source = "given" if waiting else "current thread (context registers)"
    result.problems.extend(walked.problems)
    result.initial_stack, result.stack_limit = walked.stack_base, walked.stack_limit
    if result.thread is not None:
        # Already read (and any problem reported) by the walk; only KernelStack is new here.
        result.kernel_stack = stack_bounds(target, result.thread, ProblemLog()).get("KernelStack")
    # A waiting thread's stack in use starts at its switch frame.
    result.rsp = result.kernel_stack if waiting else walked.frames[0].child_sp
    result.frames = [_with_estimate(program, graph, walked, frame) for frame in walked.frames]
    return result


def _with_estimate(program, graph, walked, frame):
    function = _function_at(program, frame.ip)
    if function is not None:
        graph.analyse(function)
    frames = walked.frames
    if frame.index + 1 < len(frames):
        uses = frames[frame.index + 1].child_sp - frame.child_sp
    elif frame.return_slot is not None and walked.arch != "arm64":
        # Up to the pushed return address; ARM64's saved lr lies inside the frame.
        uses = frame.return_slot + walked.pointer_size - frame.child_sp
    else:
        uses = None
    return StackFrame(frame.index, frame.child_sp, frame.ip, frame.function,
                      function.frame_size if function is not None else None, uses, frame.found_by)


def _function_at(program, address):
    module = program.module_for(address)
    if module is None:
        return None
    function = module.function_containing(address)
    if function is not None and function.fragment_of is not None:
        function = module.functions.get(function.fragment_of, function)
    return function

