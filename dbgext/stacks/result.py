"""What a stack walk produces: frames innermost first, each saying how it was found.

A :class:`StackResult` holds every fact the renderers and other analyses need
(``k``'s columns, ``kf``'s memory column, ``kv``'s arguments and trap frames, how
many frames came from unwind data and how many from scanning), so nothing
downstream reads memory or recomputes.
"""

from collections import namedtuple

from ..problems import ProblemLog

SCHEMA_VERSION = 1

# How a frame was found, from most to least trustworthy:
#   context      frame 0: the thread's registers
#   unwind       the previous frame was unwound with its unwind data (x64 and ARM64 .pdata/.xdata,
#                including leaf functions, epilogues and machine or trap frames) or x86 FPO data
#   frame_chain  the previous frame's frame pointer chain (x86 EBP, x64 RBP, ARM64's x29/x30 record)
#   scan         a stack slot that looks like a return address (last resort)
FOUND_BY = ("context", "unwind", "frame_chain", "scan")

# One step of a walk, from a frame to its caller: the caller's registers, how it
# was found, the slot its return address was read from, the machine frame crossed
# (or None), whether a call precedes the return address (False: the code was not
# there to read), and the bytes of parameters the unwound function was passed
# (x86 frame data: they lie between the caller's ESP and its locals), and
# whether the caller's instruction pointer is a return address (ARM64: not after
# a trap, machine or context frame, nor after clear_unwound_to_call).
Step = namedtuple("Step", "registers found_by return_slot machine_frame confirmed parameters unwound_to_call",
                  defaults=(True,))


class Frame(object):
    """One frame.  ``ip`` is where the frame's function is executing: the context's
    instruction pointer for frame 0, the return address into it for the others.
    ``return_address`` is where it returns to (the next frame's ``ip``; WinDbg's
    RetAddr), read from ``return_slot``.  ``memory`` is ``kf``'s column: this
    frame's child-SP minus the previous one's (None for frame 0)."""

    __slots__ = ("index", "child_sp", "ip", "return_address", "return_slot", "found_by", "module",
                 "function", "frame_pointer", "memory", "trap_frame", "machine_frame", "arguments",
                 "unconfirmed")

    def __init__(self, index, child_sp, ip, found_by, module=None, function=None, frame_pointer=None):
        self.index = index
        self.child_sp = child_sp
        self.ip = ip
        self.found_by = found_by
        self.module = module              # module name, or None outside every module
        self.function = function          # "module!name+0xoff" (target.symbolize)
        self.frame_pointer = frame_pointer  # x86: the frame's EBP (WinDbg's ChildEBP)
        self.return_address = None
        self.return_slot = None
        self.memory = None
        self.machine_frame = None         # address of the machine frame this frame's unwind crossed
        self.trap_frame = None            # the _KTRAP_FRAME holding that machine frame (kernel)
        self.arguments = []               # kv's "Args to Child": the stack slots above the return address
        # The return address into this frame was taken without reading the call
        # before it (the module's code is in neither the dump nor an image file).
        self.unconfirmed = False

    def as_dict(self):
        return {
            "index": self.index,
            "child_sp": self.child_sp,
            "ip": self.ip,
            "return_address": self.return_address,
            "return_slot": self.return_slot,
            "found_by": self.found_by,
            "unconfirmed": self.unconfirmed,
            "module": self.module,
            "function": self.function,
            "frame_pointer": self.frame_pointer,
            "memory": self.memory,
            "machine_frame": self.machine_frame,
            "trap_frame": self.trap_frame,
            "arguments": list(self.arguments),
        }

    def __repr__(self):
        return "Frame(%d, sp=0x%x, ip=0x%x, %s, %s)" % (self.index, self.child_sp, self.ip, self.found_by,
                                                        self.function)


class StackResult(object):
    """A thread's frames (innermost first) and the problems met walking them."""

    def __init__(self, arch, pointer_size):
        self.arch = arch
        self.pointer_size = pointer_size
        self.thread_id = None
        self.kernel_thread = None
        self.thread_source = None     # how the thread was chosen, in words
        self.stack_base = None        # the thread's stack bounds, when the target says
        self.stack_limit = None
        self.frames = []
        self.truncated = False        # max_frames reached
        self.problems = ProblemLog()

    @property
    def found_by_counts(self):
        """{how: number of frames} over :data:`FOUND_BY` (zeros included)."""
        counts = dict((how, 0) for how in FOUND_BY)
        for frame in self.frames:
            counts[frame.found_by] += 1
        return counts

    def as_dict(self):
        return {
            "schema_version": SCHEMA_VERSION,
            "arch": self.arch,
            "pointer_size": self.pointer_size,
            "thread": {"id": self.thread_id, "kernel_thread": self.kernel_thread, "source": self.thread_source,
                       "stack_base": self.stack_base, "stack_limit": self.stack_limit},
            "frames": [frame.as_dict() for frame in self.frames],
            "found_by": self.found_by_counts,
            "truncated": self.truncated,
            "problems": self.problems.as_list(),
        }
