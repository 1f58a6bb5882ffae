"""The faulting frame and the bucket of a crash, found the way ``!analyze`` finds them.

The faulting thread's frames come from the one unwinder (:func:`dbgext.stacks.analyze`:
unwind data, frame chains, and a scan only as the last resort, each frame saying how it
was found).  The crash may also name its faulting instruction itself: the bug check
argument documented as the faulting address (Arg4 of 0xD1, Arg2 of 0x7E…,
:data:`~dbgext.triage.bugchecks.FAULTING_ADDRESS_ARGUMENT`) or a user-mode dump's
exception address.  The *faulting frame* is, in this order:

1. the frame at that named address, when the stack has it (the stack confirms the
   crash's own account, and every frame above it is how the system stopped — even
   when nt's symbols are missing and its plumbing has no names);
2. the first frame that is not bug-check or exception-dispatch plumbing
   (:data:`PLUMBING`);
3. the named address itself, when the stack gives no frame (no context, an
   unreadable stack).

When a named address exists and is not the faulting frame, a note says so.

The bucket key is ``<code>_<module>!<function>`` when the module's symbols (PDB,
ISF or the debugger's; not exports alone) name the function, else
``<code>_<module>+0x<offset>``.  Both forms are recorded with the
module's image name, timestamp and size, so the report can put a dump analysed
without symbols into the bucket another dump of the same image build got by name
(the bucket does not depend on whether symbols happened to be there).
"""

import contextlib
import weakref

from ..errors import DbgextError
from ..problems import ProblemLog
from ..symbols.module import EXPORT_SYMBOLS, NO_SYMBOLS
from .bugchecks import FAULTING_ADDRESS_ARGUMENT

MAX_FRAMES = 16

_UNWINDERS = weakref.WeakKeyDictionary()  # target -> its Unwinder while a record is built (shared_unwinder)

NOT_FUNCTION_SYMBOLS = (EXPORT_SYMBOLS, NO_SYMBOLS)

BASIS_SYMBOL = "symbol"      # module!function from the module's symbols
BASIS_OFFSET = "offset"      # module+offset of an image identified by timestamp and size
BASIS_UNKNOWN = "unknown"    # an address in no loaded module
BASIS_NONE = "none"          # no crash context and no faulting address: the code alone

# Frames that say *how* the system stopped, not *where* it went wrong.
PLUMBING = frozenset(name.lower() for name in (
    "nt!KeBugCheckEx", "nt!KeBugCheck", "nt!KeBugCheck2", "nt!KiBugCheckDispatch", "nt!KiBugCheckDebugBreak",
    "nt!KiPageFault", "nt!KiGeneralProtectionFault", "nt!KiDoubleFaultAbort", "nt!KiInvalidOpcodeFault",
    "nt!KiDivideErrorFault", "nt!KiBreakpointTrap", "nt!KiDebugTrapOrFault", "nt!KiRaiseSecurityCheckFailure",
    "nt!KiFastFailDispatch", "nt!KiExceptionDispatch", "nt!KiDispatchException", "nt!KiRaiseException",
    "nt!KiSystemServiceHandler", "nt!KiSystemServiceExit", "nt!RtlRaiseStatus", "nt!ExRaiseStatus",
    "nt!RtlDispatchException", "nt!RtlpExecuteHandlerForException", "nt!RtlpExecuteHandlerForUnwind",
    "nt!RtlUnwindEx", "nt!KiCheckForKernelApcDelivery",
    "ntdll!KiUserExceptionDispatcher", "ntdll!RtlRaiseException", "ntdll!RtlDispatchException",
    "ntdll!RtlReportException", "ntdll!RtlpExecuteHandlerForException", "ntdll!RtlUserThreadStart",
    "kernelbase!RaiseException", "kernelbase!UnhandledExceptionFilter", "kernelbase!RaiseFailFastException",
    "ntdll!NtWaitForSingleObject", "ntdll!NtWaitForMultipleObjects", "ntdll!ZwWaitForSingleObject",
    "kernelbase!WaitForSingleObjectEx", "kernelbase!WaitForMultipleObjectsEx",
))


class CrashFrame(object):
    """One code address of the crash, placed in its module.

    ``how``: how the frame was found (``context``, ``unwind``, ``frame_chain``,
    ``scan``, or ``bugcheck_argument``/``exception_record`` for a faulting address
    taken from the crash itself)."""

    __slots__ = ("address", "how", "name", "module", "image", "module_offset", "function", "function_offset",
                 "module_timestamp", "module_size", "symbols")

    def __init__(self, address, how, name=None, module=None, image=None, module_offset=None, function=None,
                 function_offset=None, module_timestamp=None, module_size=None, symbols=None):
        self.address = address
        self.how = how
        self.name = name
        self.module = module
        self.image = image
        self.module_offset = module_offset
        self.function = function
        self.function_offset = function_offset
        self.module_timestamp = module_timestamp
        self.module_size = module_size
        self.symbols = symbols            # the module's symbol status: "pdb symbols", "export symbols"...

    def as_dict(self):
        return dict((name, getattr(self, name)) for name in self.__slots__)

    @classmethod
    def from_dict(cls, document):
        return cls(**dict((name, document.get(name)) for name in cls.__slots__))

    @property
    def module_relative(self):
        """``module+0x1234`` (or the bare address outside every module)."""
        if self.module is None:
            return "0x%x" % self.address
        return "%s+0x%x" % (self.module, self.module_offset)


class CrashSignature(object):
    """The faulting thread's frames, the faulting frame and the bucket it gives."""

    __slots__ = ("frames", "faulting", "bucket", "basis", "problems")

    def __init__(self):
        self.frames = []
        self.faulting = None
        self.bucket = None
        self.basis = BASIS_NONE
        self.problems = ProblemLog()


def module_identity(target, module):
    """(TimeDateStamp, SizeOfImage) from the module's PE header in target memory;
    when the header is not in the dump, what the dump's own module record says (a
    minidump's module list, a small dump's driver list: both keep the image's
    TimeDateStamp and size), the timestamp None when it has none."""
    from ..symbols.match import image_headers

    headers = image_headers(target, module)
    if headers is None:
        return module.timestamp, module.size
    return headers.timestamp, headers.size_of_image or module.size


def place(target, address, how, identities):
    """A :class:`CrashFrame` for ``address``: its module, function and names.
    ``identities`` caches module_identity per module base.  A function is taken
    from real symbols only (PDB, ISF, the debugger's): the export nearest below an
    address is often not the function holding it, so export names stay display
    names and the bucket falls back to module+offset."""
    frame = CrashFrame(address, how, name=target.symbolize(address))
    module, name, rva = target.symbols.nearest(address)
    if module is None:
        return frame
    frame.module = module.name
    frame.image = module.image
    frame.module_offset = address - module.base
    frame.symbols = target.symbols.status(module.name)
    if module.base not in identities:
        identities[module.base] = module_identity(target, module)
    frame.module_timestamp, frame.module_size = identities[module.base]
    if name is not None and frame.symbols not in NOT_FUNCTION_SYMBOLS:
        frame.function = "%s!%s" % (module.name, name)
        frame.function_offset = address - module.base - rva
    return frame


def is_plumbing(frame):
    """True for a frame in :data:`PLUMBING`, named by symbols or (nt's exports) by name."""
    function = frame.function or frame.name.split("+0x", 1)[0]
    return function.lower() in PLUMBING


def faulting_address(info, code, parameters):
    """(address, how) of the faulting instruction the crash itself names, or None."""
    if info.get("mode") == "user":
        exception = info.get("exception")
        address = exception.get("address") if isinstance(exception, dict) else None
        return (address, "exception_record") if address else None
    index = FAULTING_ADDRESS_ARGUMENT.get(code)
    if index is not None and index < len(parameters) and parameters[index]:
        return parameters[index], "bugcheck_argument"
    return None


def bucket_key(code, frame):
    """(key, basis) of a crash: ``0xD1_mydrv!CopyLeaf``, ``0xD1_mydrv+0x1234``..."""
    prefix = "0x%X" % code if code is not None else "NO_BUGCHECK"
    if frame is None:
        return prefix, BASIS_NONE
    if frame.function:
        return "%s_%s" % (prefix, frame.function), BASIS_SYMBOL
    if frame.module is not None:
        return "%s_%s" % (prefix, frame.module_relative), BASIS_OFFSET
    return "%s_UNKNOWN_MODULE" % prefix, BASIS_UNKNOWN


def crash_signature(target, info, code, parameters):
    """The :class:`CrashSignature` of the crash described by ``info`` (target.info())."""
    result = CrashSignature()
    identities = {}
    addresses, problems = unwind_faulting_thread(target)
    result.problems.extend(problems)
    result.frames = [place(target, address, how, identities) for address, how in addresses]
    named = faulting_address(info, code, parameters)
    confirmed = [frame for frame in result.frames if named is not None and frame.address == named[0]]
    result.faulting = confirmed[0] if confirmed else next(
        (frame for frame in result.frames if not is_plumbing(frame)), None)
    if result.faulting is None and named is not None:
        result.faulting = place(target, named[0], named[1], identities)
    elif result.faulting is None and result.frames:
        result.faulting = result.frames[0]
    elif named is not None and named[0] != result.faulting.address:
        result.problems.add("faulting_address_elsewhere", named[0], "the %s names %s as the faulting instruction; "
                            "the stack's first frame past the bug check is %s"
                            % ("exception record" if named[1] == "exception_record" else "bug check",
                               target.symbolize(named[0]), result.faulting.name), "note")
    result.bucket, result.basis = bucket_key(code, result.faulting)
    return result


@contextlib.contextmanager
def shared_unwinder(target):
    """Within the block, walks of ``target``'s crashing thread share one
    :class:`~dbgext.stacks.Unwinder`: the signature and the stackuse summary of one
    record load each module's unwind data once, and image problems go to the first
    walk, the signature's."""
    _UNWINDERS[target] = None
    try:
        yield
    finally:
        _UNWINDERS.pop(target, None)


def faulting_thread_stack(target, max_frames):
    """The crashing thread's :class:`~dbgext.stacks.StackResult`."""
    from ..stacks import Unwinder

    unwinder = _UNWINDERS.get(target)
    if unwinder is None:
        unwinder = Unwinder(target)
        if target in _UNWINDERS:
            _UNWINDERS[target] = unwinder
    return unwinder.walk(max_frames=max_frames)


def unwind_faulting_thread(target):
    """([(code address, how found)], problems) of the crashing thread's stack, top
    first, from the one unwinder; no frames when the target holds no context."""
    try:
        stack = faulting_thread_stack(target, MAX_FRAMES)
    except DbgextError as error:
        problems = ProblemLog()
        problems.add("no_stack", None, "the faulting thread's stack cannot be walked: %s" % error, "warning")
        return [], problems
    return [(frame.ip, frame.found_by) for frame in stack.frames], stack.problems
