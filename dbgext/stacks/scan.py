"""The last resort: find the next return address by scanning the stack.

A slot is taken for a return address when its value points into a loaded module's
code (past its header page) *and* the bytes just before it are a ``call``
instruction (ARM64: ``bl`` or ``blr``) — what ``dps`` readers and WinDbg's fallback do.  Where those bytes
cannot be read (a minidump holds no code, and no image file was found) the value
is still a candidate, but an *unconfirmed* one: the frame it gives says so — unless
the module's symbols place it outside every function (a pointer to data).  A
scan can take a stale return address (left by an earlier, finished call) for a
frame, which is why the walker only scans where no unwind data or frame chain
applies and marks such frames ``scan``.
"""

import struct

from .arm64_unwind import INSTRUCTION_SIZE as ARM64_INSTRUCTION_SIZE
from .arm64_unwind import follows_call as follows_arm64_call

MAX_SCAN_SLOTS = 0x800  # 16 KiB of x64 stack (8 KiB on x86): a kernel stack's worth of search
CALL_WINDOW = 7         # the longest call encoding checked below
HEADER_PAGE = 0x1000    # an image's headers: never code, often pointed at (a module's base, HMODULE)


def follows_call(before):
    """True when ``before`` (the bytes just ahead of a candidate return address)
    ends with an x86/x64 ``call`` encoding."""
    n = len(before)
    if n >= 5 and before[n - 5] == 0xE8:                                    # call rel32
        return True
    if n >= 2 and before[n - 2] == 0xFF and (before[n - 1] & 0xF8) == 0xD0:  # call reg
        return True
    if n >= 3 and before[n - 3] == 0xFF and (before[n - 2] & 0xF8) == 0x50:  # call [reg+disp8]
        return True
    if n >= 6 and before[n - 6] == 0xFF and before[n - 5] in (0x15, 0x90, 0x91, 0x92, 0x93, 0x95, 0x96, 0x97):
        return True                                                        # call [rip+disp32] / [reg+disp32]
    if n >= 3 and before[n - 3] == 0xFF and before[n - 2] == 0x14 and before[n - 1] == 0x24:
        return True                                                        # call [rsp]
    return False


class ReturnAddresses(object):
    """Decides (and remembers) whether a value is a return address: :meth:`verdict`
    is True (a call precedes it), None (it points into a module's code but the call
    site cannot be read: unconfirmed) or False (not a return address)."""

    def __init__(self, target, images, code_map=None):
        self.target = target
        self.images = images
        # code_map(module, rva): True inside a function symbols describe, False
        # outside every one, None when they say nothing — asked only where the
        # call site cannot be read.
        self.code_map = code_map
        # (bytes before a return address that hold the call, the test of them)
        self.call_window, self.follows_call = ((ARM64_INSTRUCTION_SIZE, follows_arm64_call)
                                               if target.arch == "arm64" else (CALL_WINDOW, follows_call))
        self._known = {}
        modules = images.modules
        # Most stack slots are data: a range test spares them the module lookup.
        self.lowest = modules[0].base if modules else 0
        self.highest = max(module.end for module in modules) if modules else 0

    def verdict(self, value):
        if not self.lowest <= value < self.highest:
            return False
        known = self._known.get(value, self)
        if known is self:
            known = self._known[value] = self._follows_call(value)
        return known

    def inside_function(self, value):
        """True when symbols place ``value`` inside a function (past its start)."""
        module = self.images.module_at(value)
        return bool(module is not None and self.code_map is not None and self.code_map(module, value - module.base))

    def plausible(self, value):
        """A candidate: confirmed, or unconfirmed for want of code."""
        return self.verdict(value) is not False

    def _follows_call(self, value):
        module = self.images.module_at(value)
        if module is None or value - module.base < HEADER_PAGE:
            return False
        window = self.call_window
        read = self.target.try_read(value - window, window)
        if read.complete:
            return self.follows_call(read.data)
        # Code paged out of the dump (or never in it): the module's image file may have it.
        code = self.images.code_for(module).code(value - window - module.base, window)
        if len(code) == window:
            return self.follows_call(code)
        inside = self.code_map(module, value - module.base) if self.code_map is not None else None
        return None if inside is not False else False


def scan_for_return(target, returns, start, top, pointer_size, confirmed_only=False):
    """The first slot at or above ``start`` (below ``top``, within MAX_SCAN_SLOTS)
    holding a return address: (slot, value, confirmed), or None.  An unconfirmed
    one is taken unless ``confirmed_only``."""
    span = max(0, min(MAX_SCAN_SLOTS * pointer_size, top - start))
    span -= span % pointer_size
    if span == 0:
        return None
    read = target.try_read(start, span)
    values = struct.unpack("<%d%s" % (span // pointer_size, "Q" if pointer_size == 8 else "I"), read.data)
    lowest, highest = returns.lowest, returns.highest
    for index, value in enumerate(values):
        if lowest <= value < highest:
            verdict = returns.verdict(value)
            if verdict is False or (confirmed_only and verdict is None):
                continue
            slot = start + index * pointer_size
            if read.readable(slot, pointer_size):
                return slot, value, verdict is True
    return None
