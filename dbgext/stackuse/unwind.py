"""The x64 unwind-data parser lives in :mod:`dbgext.stacks.unwind_data` (the stack
unwinder and the frame-size analysis share it); these names stay importable here."""

from ..stacks.unwind_data import (MAX_CHAIN_LENGTH, UnwindCode, UnwindFrame, UnwindInfo,  # noqa: F401
                                  frame_from_unwind, parse_unwind_info)
