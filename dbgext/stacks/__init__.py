"""The one stack unwinder: a thread's frames, each saying how it was found.

    result = dbgext.stacks.analyze(target)                 # the crashing/current thread
    result = dbgext.stacks.analyze(target, thread=thread)  # a Thread, or a KTHREAD address
    for frame in result.frames:
        frame.child_sp, frame.ip, frame.return_address, frame.found_by, frame.function

``found_by`` is one of :data:`FOUND_BY`: ``context`` (frame 0), ``unwind`` (x64
unwind data with RtlVirtualUnwind's semantics: chains, epilogues, frame registers,
machine frames, leaf functions), ``frame_chain`` (x86 EBP chain) or ``scan`` (a
stack slot that looks like a return address: the last resort).  Problems met on
the way are in ``result.problems``; ``result.as_dict()`` is the ``k --json``
document.  :class:`Unwinder` keeps modules' unwind data across walks of one target.
"""

from .images import images_from_directories
from .result import FOUND_BY, Frame, StackResult
from .walk import MAX_FRAMES, Unwinder, analyze

__all__ = ["analyze", "Unwinder", "StackResult", "Frame", "FOUND_BY", "MAX_FRAMES", "images_from_directories"]
