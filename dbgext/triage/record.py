"""The per-dump triage record and the analysis plug-in interface.

One analysis pass per dump produces one compact :class:`DumpRecord`: identity (the
content hash), the bug check named and its arguments labelled, the faulting frame
and bucket (:mod:`.signature`), a small summary per analysis and every problem
found.  Only this record leaves the worker that read the dump (Fay's "early
aggregation close to the data": the raw memory never travels).

An analysis plugs in as a named adapter ``summarize(target) -> dict``.  The dict is
the analysis' compact summary; its optional ``"problems"`` entry is an iterable of
:class:`dbgext.problems.Problem` (a result's ``problems``), kept in the record under
the analysis' name.  An adapter declares the package it needs; when that package is
not installed the analysis is simply absent from records.
"""

import datetime
import hashlib
import importlib
import time
from collections import OrderedDict

from ..errors import BadInput, DbgextError
from ..problems import Problem, ProblemLog
from .bugchecks import describe_crash
from .signature import CrashFrame, crash_signature, shared_unwinder

SCHEMA_VERSION = 1
STATUS_OK = "ok"
STATUS_FAILED = "failed"

# Modules imported (once per process) to register the built-in adapters.
BUILTIN_PLUGIN_MODULES = ("dbgext.triage.analyses",)

# Facts of target.info() shown in the record as they are (a small dump's unloaded
# drivers and memory-manager state).
DUMP_FACTS = ("dump_type", "broken_driver", "unloaded_drivers", "unloaded_modules", "mm")

# -- content hash ------------------------------------------------------------------

HASH_CHUNK = 1 << 20


def content_hash(path):
    """SHA-256 of the whole file, read in 1 MiB chunks (memory stays flat whatever
    the dump's size; hashlib releases the GIL while it hashes).  A dump's identity
    is its content: two files that differ anywhere have different keys.

    Raises BadInput when the file cannot be read."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb", buffering=0) as handle:
            buffer = bytearray(HASH_CHUNK)
            view = memoryview(buffer)
            while True:
                count = handle.readinto(buffer)
                if not count:
                    break
                digest.update(view[:count])
    except OSError as error:
        raise BadInput("cannot read %s: %s" % (path, error.strerror or error))
    return digest.hexdigest()


# -- analysis plug-ins -------------------------------------------------------------

class Analysis(object):
    """A registered adapter: ``summarize(target) -> dict``."""

    __slots__ = ("name", "summarize", "description")

    def __init__(self, name, summarize, description=""):
        self.name = name
        self.summarize = summarize
        self.description = description


_REGISTRY = OrderedDict()
_LOADED_PLUGIN_MODULES = set()


def register_analysis(name, summarize, description=""):
    """Add (or replace) the analysis ``name``; plug-in modules call this on import."""
    _REGISTRY[name] = Analysis(name, summarize, description)
    return _REGISTRY[name]


def unregister_analysis(name):
    _REGISTRY.pop(name, None)


def load_plugins(modules=()):
    """Import the built-in adapters and any extra plug-ins.  A plug-in is a module
    that registers its analyses on import, or ``module:function`` naming a function
    that registers them.  Idempotent; one that cannot be loaded is a BadInput."""
    for spec in tuple(BUILTIN_PLUGIN_MODULES) + tuple(modules or ()):
        if spec in _LOADED_PLUGIN_MODULES:
            continue
        module_name, _, function_name = spec.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            raise BadInput("cannot import triage plug-in %s: %s" % (module_name, error))
        if function_name:
            register = getattr(module, function_name, None)
            if not callable(register):
                raise BadInput("triage plug-in %s has no function %s" % (module_name, function_name))
            register()
        _LOADED_PLUGIN_MODULES.add(spec)


def registered_analyses():
    return list(_REGISTRY.values())


def select_analyses(names=None):
    """The analyses to run: all registered ones (``names`` None) or the named ones.
    An unknown name is a BadInput."""
    if names is None:
        return list(_REGISTRY.values())
    unknown = [name for name in names if name not in _REGISTRY]
    if unknown:
        raise BadInput("unknown analysis %s (known: %s)" % (
            ", ".join(unknown), ", ".join(_REGISTRY) or "none"))
    return [_REGISTRY[name] for name in names]


# -- the record ----------------------------------------------------------------------

class DumpRecord(object):
    """Everything triage keeps about one dump.  ``as_dict`` is the form that travels
    between processes and machines and goes into JSON (docs/json-schema/triage.md)."""

    FIELDS = ("path", "size", "hash", "kind", "arch", "build", "system_time",
              "bugcheck_code", "bugcheck_name", "bugcheck_parameters", "bugcheck_labels",
              "faulting", "bucket", "bucket_basis", "frames", "dump", "analyses", "timings",
              "problems", "status", "reason", "seconds")
    # The JSON document: the fields, with the derived faulting function after the bucket.
    DOCUMENT = FIELDS[:13] + ("signature",) + FIELDS[13:]

    __slots__ = FIELDS

    def __init__(self, path=None, size=None, hash=None):  # noqa: A002 - the record's field name
        self.path = path
        self.size = size
        self.hash = hash
        self.kind = None
        self.arch = None
        self.build = None
        self.system_time = None          # ISO 8601 UTC string
        self.bugcheck_code = None        # a minidump's exception code
        self.bugcheck_name = None
        self.bugcheck_parameters = []
        self.bugcheck_labels = []        # per parameter: its documented meaning or None
        self.faulting = None             # CrashFrame
        self.bucket = None               # "0xD1_mydrv!CopyLeaf"
        self.bucket_basis = None         # signature.BASIS_*
        self.frames = []                 # CrashFrames of the faulting thread, top first
        self.dump = OrderedDict()        # DUMP_FACTS the target reports
        self.analyses = OrderedDict()    # analysis name -> compact summary dict
        self.timings = OrderedDict()     # step name -> seconds it took
        self.problems = OrderedDict()    # analysis name -> ProblemLog
        self.status = STATUS_OK
        self.reason = None
        self.seconds = 0.0

    @property
    def signature(self):
        """The faulting function (``mydrv!CopyLeaf``), else ``module+0xoffset``."""
        if self.faulting is None:
            return None
        return self.faulting.function or self.faulting.module_relative

    def problems_of(self, analysis):
        log = self.problems.get(analysis)
        if log is None:
            log = self.problems[analysis] = ProblemLog()
        return log

    def all_problems(self):
        """(analysis, Problem) pairs in the record's order."""
        return [(analysis, problem) for analysis, log in self.problems.items() for problem in log]

    def fail(self, reason):
        """Mark failed; the first reason is kept, later ones are appended."""
        self.status = STATUS_FAILED
        self.reason = reason if not self.reason else "%s; %s" % (self.reason, reason)

    def as_dict(self):
        document = OrderedDict([("schema_version", SCHEMA_VERSION)])
        for name in self.DOCUMENT:
            document[name] = getattr(self, name)
        document["faulting"] = self.faulting.as_dict() if self.faulting else None
        document["frames"] = [frame.as_dict() for frame in self.frames]
        document["dump"] = OrderedDict(self.dump)
        document["analyses"] = OrderedDict(self.analyses)
        document["timings"] = OrderedDict(self.timings)
        document["problems"] = [OrderedDict([("analysis", analysis)] + list(problem.as_dict().items()))
                                for analysis, problem in self.all_problems()]
        return document

    @classmethod
    def from_dict(cls, document):
        record = cls()
        for name in cls.FIELDS:
            if name in document:
                setattr(record, name, document[name])
        record.faulting = CrashFrame.from_dict(document["faulting"]) if document.get("faulting") else None
        record.frames = [CrashFrame.from_dict(frame) for frame in document.get("frames") or ()]
        record.problems = OrderedDict()
        for item in document.get("problems") or ():
            record.problems_of(item["analysis"]).append(as_problem(item))
        return record


def failed_record(path, size, content_key, reason, seconds=0.0):
    record = DumpRecord(path, size, content_key)
    record.fail(reason)
    record.seconds = seconds
    return record


# -- building a record from a target ---------------------------------------------------

def iso_time(value):
    """A dump time as ISO 8601 UTC: FILETIME (kernel dumps) or time_t (minidumps)."""
    if not isinstance(value, int) or value <= 0:
        return None
    try:
        if value > 1 << 40:  # 100 ns ticks since 1601
            moment = datetime.datetime(1601, 1, 1) + datetime.timedelta(microseconds=value // 10)
        else:
            moment = datetime.datetime(1970, 1, 1) + datetime.timedelta(seconds=value)
    except OverflowError:
        return None
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def bugcheck_of(info):
    """(code, [parameters]) from target.info(): a kernel dump's bug check (a list
    [code, p1..p4] or a dict), else a minidump's exception code and parameters —
    what WER buckets user-mode crashes by."""
    bugcheck = info.get("bugcheck")
    if isinstance(bugcheck, dict):
        code = bugcheck.get("code")
        parameters = list(bugcheck.get("parameters") or [])
    elif isinstance(bugcheck, (list, tuple)) and bugcheck:
        code, parameters = bugcheck[0], list(bugcheck[1:])
    else:
        code, parameters = None, []
    exception = info.get("exception")
    if not code and info.get("mode") == "user" and isinstance(exception, dict):
        code, parameters = exception.get("code"), list(exception.get("parameters") or [])
    if not code:
        return None, []
    return code, parameters


def fill_identity(record, target):
    info = target.info() or {}
    record.kind = info.get("kind")
    record.arch = info.get("arch") or target.arch
    build = info.get("build")
    record.build = build if isinstance(build, int) else None
    record.system_time = iso_time(info.get("system_time") or info.get("time_date_stamp"))
    record.bugcheck_code, record.bugcheck_parameters = bugcheck_of(info)
    if record.bugcheck_code is not None:
        record.bugcheck_name, arguments = describe_crash(record.bugcheck_code, record.bugcheck_parameters,
                                                         user_mode=info.get("mode") == "user")
        record.bugcheck_labels = [argument.label for argument in arguments]
    for key in DUMP_FACTS:
        if info.get(key) is not None:
            record.dump[key] = info[key]
    return info


def as_problem(item):
    """A problem of target.info(): a Problem, or its as_dict() form."""
    if isinstance(item, Problem):
        return item
    return Problem.from_dict(item)


def summary_problems(name, problems):
    """An adapter's problems as a ProblemLog; anything but Problem objects is the
    adapter's bug, reported as such."""
    problems = list(problems or ())
    wrong = [item for item in problems if not isinstance(item, Problem)]
    if wrong:
        raise DbgextError("analysis %s reported problems that are not dbgext.problems.Problem objects (%s)"
                          % (name, type(wrong[0]).__name__))
    return ProblemLog(problems)


def run_analysis(record, analysis, target):
    """One adapter: its summary goes in the record, its problems under its name; an
    exception fails the record with the analysis named in the reason."""
    started = time.time()
    try:
        summary = OrderedDict(analysis.summarize(target) or {})
        problems = summary_problems(analysis.name, summary.pop("problems", None))
    except DbgextError as error:
        record.fail("%s: %s" % (analysis.name, error))
        return
    except Exception as error:  # an analysis bug must not take the batch down
        record.fail("%s: %s: %s" % (analysis.name, type(error).__name__, error))
        return
    finally:
        record.timings[analysis.name] = round(time.time() - started, 6)
    if problems:
        record.problems[analysis.name] = problems.finish()
    record.analyses[analysis.name] = summary


def build_record(target, path=None, size=None, content_key=None, analyses=None):
    """The full record for an open target: identity, bug check, faulting frame and
    bucket, then each selected analysis (``analyses``: Analysis objects; None = all
    available)."""
    with shared_unwinder(target):
        return _build_record(target, path, size, content_key, analyses)


def _build_record(target, path, size, content_key, analyses):
    started = time.time()
    record = DumpRecord(path, size, content_key)
    info = fill_identity(record, target)
    record.problems_of("dump").extend(as_problem(item) for item in info.get("problems") or ())
    signature = crash_signature(target, info, record.bugcheck_code, record.bugcheck_parameters)
    record.frames = signature.frames
    record.faulting = signature.faulting
    record.bucket, record.bucket_basis = signature.bucket, signature.basis
    if signature.problems:
        record.problems_of("signature").extend(signature.problems)
    record.timings["signature"] = round(time.time() - started, 6)
    for analysis in (select_analyses() if analyses is None else analyses):
        run_analysis(record, analysis, target)
    for name in [name for name, log in record.problems.items() if not log]:
        del record.problems[name]
    record.seconds = round(time.time() - started, 6)
    return record
