"""The per-dump triage record and the analysis plug-in interface.

One analysis pass per dump produces one compact :class:`DumpRecord`: identity,
bug check, the faulting thread's stack signature, a small summary per analysis and
every problem the analyses reported.  Only this record leaves the worker that read
the dump (Fay's "early aggregation close to the data": the raw memory never travels).

An analysis plugs in as a named adapter ``summarize(target) -> dict``.  The dict is
the analysis' compact summary; its optional ``"problems"`` entry (a list of strings
or ``{"message", "address"}`` dicts) is lifted into the record's problem list.  An
adapter declares the package it needs; when that package is not installed the
analysis is simply absent from records.
"""

import datetime
import hashlib
import importlib
import os
import time
from collections import OrderedDict

from ..errors import BadInput, DbgextError

STATUS_OK = "ok"
STATUS_FAILED = "failed"

# Modules imported (once per process) to register the built-in adapters.
BUILTIN_PLUGIN_MODULES = ("dbgext.triage.analyses",)

# -- content hash ------------------------------------------------------------------

HASH_SCHEME = "sha256-sampled-v1"
HASH_CHUNK = 0x10000          # 64 KiB per sample
HASH_SAMPLES = 16             # evenly spaced samples between head and tail
HASH_FULL_LIMIT = 0x200000    # files up to 2 MiB are hashed whole


def content_hash(path):
    """A bounded, fast content key for a dump file.

    Files up to 2 MiB are hashed whole.  Larger files hash the size, the first and
    last 64 KiB and 16 evenly spaced 64 KiB samples (about 1.1 MiB read whatever
    the dump's size).  A dump's header (bug check, system time, context) and the
    spread of samples make two different dumps collide only if they share size,
    header and every sample — in practice never for real crash dumps, while hashing
    a 64 GiB full dump whole would cost minutes per file.

    Raises BadInput when the file cannot be read."""
    try:
        size = os.path.getsize(path)
        digest = hashlib.sha256()
        digest.update(("%s:%d:" % (HASH_SCHEME, size)).encode("ascii"))
        with open(path, "rb") as handle:
            if size <= HASH_FULL_LIMIT:
                digest.update(handle.read())
            else:
                step = (size - HASH_CHUNK) // (HASH_SAMPLES + 1)
                offsets = [0] + [step * (i + 1) for i in range(HASH_SAMPLES)] + [size - HASH_CHUNK]
                for offset in offsets:
                    handle.seek(offset)
                    digest.update(handle.read(HASH_CHUNK))
    except OSError as error:
        raise BadInput("cannot read %s: %s" % (path, error.strerror or error))
    return digest.hexdigest()


# -- analysis plug-ins -------------------------------------------------------------

class Analysis(object):
    """A registered adapter: ``summarize(target) -> dict`` needing package ``requires``."""

    __slots__ = ("name", "summarize", "requires", "description")

    def __init__(self, name, summarize, requires=None, description=""):
        self.name = name
        self.summarize = summarize
        self.requires = requires
        self.description = description

    def available(self):
        if not self.requires:
            return True
        try:
            importlib.import_module(self.requires)
        except ImportError:
            return False
        return True


_REGISTRY = OrderedDict()
_LOADED_PLUGIN_MODULES = set()


def register_analysis(name, summarize, requires=None, description=""):
    """Add (or replace) the analysis ``name``; plug-in modules call this on import."""
    _REGISTRY[name] = Analysis(name, summarize, requires, description)
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
    """The analyses to run: all available ones (``names`` None) or the named ones.

    An unknown name is a BadInput; a known analysis whose package is missing is
    left out (it is absent from records, not an error)."""
    if names is None:
        return [analysis for analysis in _REGISTRY.values() if analysis.available()]
    unknown = [name for name in names if name not in _REGISTRY]
    if unknown:
        raise BadInput("unknown analysis %s (known: %s)" % (
            ", ".join(unknown), ", ".join(_REGISTRY) or "none"))
    return [_REGISTRY[name] for name in names if _REGISTRY[name].available()]


# -- the record ----------------------------------------------------------------------

class DumpRecord(object):
    """Everything triage keeps about one dump.  Plain data; ``as_dict`` is the form
    that travels between processes and machines and goes into JSON."""

    FIELDS = ("path", "size", "hash", "kind", "arch", "build", "system_time",
              "bugcheck_code", "bugcheck_parameters", "frames", "signature",
              "analyses", "timings", "problems", "status", "reason", "seconds")

    __slots__ = FIELDS

    def __init__(self, path=None, size=None, hash=None):  # noqa: A002 - the record's field name
        self.path = path
        self.size = size
        self.hash = hash
        self.kind = None
        self.arch = None
        self.build = None
        self.system_time = None          # ISO 8601 UTC string
        self.bugcheck_code = None
        self.bugcheck_parameters = []
        self.frames = []                 # top of the faulting stack, "module!function" (or hex)
        self.signature = None            # the faulting module!function (the WER-like bucket key)
        self.analyses = OrderedDict()    # analysis name -> compact summary dict
        self.timings = OrderedDict()     # analysis name -> seconds it took
        self.problems = []               # {"analysis", "message", "address"}
        self.status = STATUS_OK
        self.reason = None
        self.seconds = 0.0

    def add_problem(self, analysis, message, address=None):
        self.problems.append({"analysis": analysis, "message": str(message), "address": address})

    def fail(self, reason):
        """Mark failed; the first reason is kept, later ones are appended."""
        self.status = STATUS_FAILED
        self.reason = reason if not self.reason else "%s; %s" % (self.reason, reason)

    def as_dict(self):
        document = OrderedDict((name, getattr(self, name)) for name in self.FIELDS)
        document["analyses"] = OrderedDict(self.analyses)
        document["timings"] = OrderedDict(self.timings)
        return document

    @classmethod
    def from_dict(cls, document):
        record = cls()
        for name in cls.FIELDS:
            if name in document:
                setattr(record, name, document[name])
        return record


def failed_record(path, size, content_key, reason, seconds=0.0):
    record = DumpRecord(path, size, content_key)
    record.fail(reason)
    record.seconds = seconds
    return record


# -- building a record from a target ---------------------------------------------------

FILETIME_EPOCH = datetime.datetime(1970, 1, 1) - datetime.datetime(1601, 1, 1)


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
    return info


def run_analysis(record, analysis, target):
    """One adapter: its summary goes in the record, its problems in the problem
    list; an exception fails the record with the analysis named in the reason."""
    started = time.time()
    try:
        summary = analysis.summarize(target)
    except DbgextError as error:
        record.fail("%s: %s" % (analysis.name, error))
        return
    except Exception as error:  # an analysis bug must not take the batch down
        record.fail("%s: %s: %s" % (analysis.name, type(error).__name__, error))
        return
    finally:
        record.timings[analysis.name] = round(time.time() - started, 6)
    summary = OrderedDict(summary or {})
    for problem in summary.pop("problems", None) or ():
        if isinstance(problem, dict):
            record.add_problem(analysis.name, problem.get("message", ""), problem.get("address"))
        else:
            record.add_problem(analysis.name, problem)
    record.analyses[analysis.name] = summary


def build_record(target, path=None, size=None, content_key=None, analyses=None):
    """The full record for an open target: identity, bug check, stack signature,
    then each selected analysis (``analyses``: Analysis objects; None = all available)."""
    from .signature import faulting_signature

    started = time.time()
    record = DumpRecord(path, size, content_key)
    info = fill_identity(record, target)
    for message in info.get("problems") or ():
        record.add_problem("dump", message)
    stack = faulting_signature(target, info)
    record.frames = stack.frames
    record.signature = stack.signature
    for message, address in stack.problems:
        record.add_problem("signature", message, address)
    for analysis in (select_analyses() if analyses is None else analyses):
        run_analysis(record, analysis, target)
    record.seconds = round(time.time() - started, 6)
    return record
