"""Find the ETW loggers and their stack caches: nt!EtwpHostSiloState ->
_ETW_SILODRIVERSTATE.EtwpLoggerContext (array of MaxLoggers pointers, unused slots
hold a small non-pointer) -> _WMI_LOGGER_CONTEXT {LoggerId, LoggerName, StackCache}.

Layouts come from :func:`dbgext.layouts.lookup_layout`: the target's type
information when it has it, else the built-in layouts for its build.
"""

from ..errors import BadInput, DbgextError, LayoutNotFound, SymbolNotFound, UnreadableMemory
from ..layouts import lookup_layout
from ..problems import ProblemLog
from . import layouts

ASK_FOR_ADDRESSES = "give the logger context's or the stack cache's address"


class LoggerInfo(object):
    """One logger context: its id, name and stack cache pointer, and what could
    not be read of it."""

    __slots__ = ("logger_id", "name", "context", "stack_cache", "problems")

    def __init__(self, context, logger_id=None, name=None, stack_cache=0):
        self.context = context
        self.logger_id = logger_id
        self.name = name
        self.stack_cache = stack_cache
        self.problems = ProblemLog()


class LoggerLayouts(object):
    """The logger context and silo state layouts, each saying where it came from."""

    def __init__(self, logger, silo):
        self.logger = logger
        self.silo = silo

    @property
    def sources(self):
        return {"logger_context": self.logger.source, "silo_state": self.silo.source}


def logger_layouts(target):
    """The layouts of _WMI_LOGGER_CONTEXT and _ETW_SILODRIVERSTATE; BadInput (naming
    what to give instead) when neither type information nor a built-in layout
    for this build has them."""
    try:
        return LoggerLayouts(
            lookup_layout(target, layouts.LOGGER_TYPE, layouts.BUILTIN, fields=layouts.LOGGER_FIELDS),
            lookup_layout(target, layouts.SILO_TYPE, layouts.BUILTIN, fields=layouts.SILO_FIELDS))
    except LayoutNotFound as error:
        raise BadInput("%s; %s" % (error, ASK_FOR_ADDRESSES))


def read_logger(target, context, found):
    """A LoggerInfo for the logger context at ``context`` (``found``: LoggerLayouts);
    bad memory becomes its problems, never an exception."""
    info = LoggerInfo(context)
    logger = found.logger
    try:
        info.logger_id = target.u32(context + logger.offset("LoggerId"))
        info.stack_cache = target.pointer(context + logger.offset("StackCache"))
    except UnreadableMemory as error:
        info.problems.add("unreadable", error.address, "logger context %s is unreadable"
                          % target.format_address(context))
        return info
    try:
        info.name = target.unicode_string(context + logger.offset("LoggerName"), max_chars=256)
    except DbgextError as error:
        info.problems.add("logger_name", context + logger.offset("LoggerName"), str(error))
    return info


def discover_loggers(target, found):
    """Every logger in the host silo's logger array (``found``: LoggerLayouts)."""
    cell = target.symbol_address(layouts.HOST_SILO_SYMBOL)
    if cell is None:
        raise SymbolNotFound("%s is not known (no symbols?); %s" % (layouts.HOST_SILO_SYMBOL, ASK_FOR_ADDRESSES))
    try:
        silo = target.pointer(cell)
        max_loggers = target.u32(silo + found.silo.offset("MaxLoggers"))
        array = target.pointer(silo + found.silo.offset("EtwpLoggerContext"))
    except UnreadableMemory as error:
        raise UnreadableMemory(error.address, detail="reading the ETW silo state")
    if not 0 < max_loggers <= layouts.MAX_LOGGERS:
        max_loggers = layouts.MAX_LOGGERS
    try:
        slots = target.pointers(array, max_loggers)
    except UnreadableMemory as error:
        raise UnreadableMemory(error.address, detail="reading the logger context array")
    return [read_logger(target, slot, found) for slot in slots if slot >= layouts.KERNEL_SPACE_START]
