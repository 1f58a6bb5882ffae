"""Find the ETW loggers and their stack caches: nt!EtwpHostSiloState ->
_ETW_SILODRIVERSTATE.EtwpLoggerContext (array of MaxLoggers pointers, unused slots
hold a small non-pointer) -> _WMI_LOGGER_CONTEXT {LoggerId, LoggerName, StackCache}.

Field offsets come from the target's type information when it has it, else from
the per-build profile in ``layouts``.
"""

from ..errors import BadInput, DbgextError, SymbolNotFound, UnreadableMemory
from . import layouts


class LoggerInfo(object):
    __slots__ = ("logger_id", "name", "context", "stack_cache", "problems")

    def __init__(self, context, logger_id=None, name=None, stack_cache=0):
        self.context = context
        self.logger_id = logger_id
        self.name = name
        self.stack_cache = stack_cache
        self.problems = []


class Offsets(object):
    """Where the fields live, and where that knowledge came from."""

    def __init__(self, logger, silo, source):
        self.logger = logger
        self.silo = silo
        self.source = source


def field_offsets(target):
    """Offsets from type information, else from the build profile; BadInput if neither."""
    logger = {}
    for field in ("LoggerId", "LoggerName", "StackCache"):
        logger[field] = target.field_offset(layouts.LOGGER_TYPE, field)
    silo = {}
    for field in ("MaxLoggers", "EtwpLoggerContext"):
        silo[field] = target.field_offset(layouts.SILO_TYPE, field)
    if None not in logger.values() and None not in silo.values():
        return Offsets(logger, silo, "type information")
    build = (target.info() or {}).get("build")
    profile = layouts.profile_for_build(build)
    if profile is None:
        raise BadInput("no type information for _WMI_LOGGER_CONTEXT and no offsets profile for build %s; "
                       "give --logger-context ADDR or --cache ADDR" % build)
    for field, offset in profile["logger"].items():
        if logger.get(field) is None:
            logger[field] = offset
    for field, offset in profile["silo"].items():
        if silo.get(field) is None:
            silo[field] = offset
    return Offsets(logger, silo, "build %s profile (%s)" % (build, profile["name"]))


def read_logger(target, context, offsets):
    """A LoggerInfo for the logger context at ``context`` (problems noted, never raises
    for bad memory)."""
    info = LoggerInfo(context)
    try:
        info.logger_id = target.u32(context + offsets.logger["LoggerId"])
        info.stack_cache = target.pointer(context + offsets.logger["StackCache"])
    except UnreadableMemory as error:
        info.problems.append(("unreadable", error.address, "logger context is unreadable"))
        return info
    try:
        info.name = target.unicode_string(context + offsets.logger["LoggerName"], max_chars=256)
    except DbgextError as error:
        info.problems.append(("logger_name", context + offsets.logger["LoggerName"], str(error)))
    return info


def discover_loggers(target):
    """(loggers, offsets): every logger in the host silo's logger array."""
    offsets = field_offsets(target)
    cell = target.symbol_address(layouts.HOST_SILO_SYMBOL)
    if cell is None:
        raise SymbolNotFound("%s is not known (no symbols?); give --logger-context ADDR or --cache ADDR"
                             % layouts.HOST_SILO_SYMBOL)
    try:
        silo = target.pointer(cell)
        max_loggers = target.u32(silo + offsets.silo["MaxLoggers"])
        array = target.pointer(silo + offsets.silo["EtwpLoggerContext"])
    except UnreadableMemory as error:
        raise UnreadableMemory(error.address, detail="reading the ETW silo state")
    if not 0 < max_loggers <= layouts.MAX_LOGGERS:
        max_loggers = layouts.MAX_LOGGERS
    try:
        slots = target.pointers(array, max_loggers)
    except UnreadableMemory as error:
        raise UnreadableMemory(error.address, detail="reading the logger context array")
    loggers = []
    for slot in slots:
        if slot >= layouts.KERNEL_SPACE_START:
            loggers.append(read_logger(target, slot, offsets))
    return loggers, offsets
