"""Fetching one file from a symbol server into a local cache, as carefully as the
best symbol-server clients do.  The server, and the image naming the file, are
untrusted:

* the name in the cache comes only from the base name the image gives, and a name
  that is empty, ``.``, ``..``, or holds a separator or a drive colon after that
  is refused; every path written is checked to lie inside the cache (no link in
  the cache leads out of it);
* URLs are percent-encoded, one path segment per part;
* a download has an overall deadline and a minimum transfer rate (after a grace
  period) besides the timeout on silence, and a size cap checked against
  Content-Length before anything is written;
* the first bytes must be what the file should be (an MSF 7.0 PDB, a cabinet, an
  ``MZ`` image); HTML, junk, an empty or a truncated body is refused and reported
  as what it is;
* the body goes to a temporary file in the destination folder, removed on any
  failure, Ctrl-C and SIGTERM; the finished file is checked (:func:`fetch`'s
  ``verify``) and only then linked into place, never over an existing file or link;
* as symsrv does, ``name.pd_`` (an MSZIP cabinet, :mod:`dbgext.symbols.cab`) is
  asked for when ``name.pdb`` is missing, then ``file.ptr``, whose ``PATH:`` line
  names where the file is (a URL or a file path) and whose ``MSG:`` line says why
  it is not.

Progress goes to a callback the caller supplies (the CLI's :class:`ProgressBar`);
the library itself prints nothing.
"""

import http.client
import os
import signal
import socket
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

from ..errors import BadInput
from ..outputs import is_link
from ..winpath import file_name
from .cab import CAB_SIGNATURE, expand_cabinet
from .pdb import MSF_MAGIC

DOWNLOAD_TIMEOUT = 30.0          # seconds of silence
DOWNLOAD_DEADLINE = 600.0        # seconds for one file, however it trickles
MINIMUM_RATE = 4096              # bytes per second, averaged, once the grace period is over
RATE_GRACE = 10.0                # seconds before the minimum rate applies
DOWNLOAD_CHUNK = 1 << 16
MAX_DOWNLOAD = 4 << 30           # no PDB or image is bigger
MAX_FILE_PTR = 4096
HEAD_BYTES = 64                  # what is read before deciding the body is worth writing

SIGNATURES = {"pdb": (MSF_MAGIC,), "cab": (CAB_SIGNATURE,), "image": (b"MZ",)}
WHAT = {"pdb": "a PDB", "cab": "a cabinet", "image": "a PE image"}


class DownloadError(BadInput):
    """A file that could not be fetched; ``missing``: the server does not have it."""

    def __init__(self, message, missing=False):
        super().__init__(message)
        self.missing = missing


class Limits(object):
    """What one download may take: ``timeout`` seconds of silence, ``deadline``
    seconds in all, ``minimum_rate`` bytes/s on average after ``grace`` seconds,
    ``max_bytes`` in all."""

    __slots__ = ("timeout", "deadline", "minimum_rate", "grace", "max_bytes")

    def __init__(self, timeout=DOWNLOAD_TIMEOUT, deadline=DOWNLOAD_DEADLINE, minimum_rate=MINIMUM_RATE,
                 grace=RATE_GRACE, max_bytes=MAX_DOWNLOAD):
        self.timeout = timeout
        self.deadline = deadline
        self.minimum_rate = minimum_rate
        self.grace = grace
        self.max_bytes = max_bytes


def cache_name(name):
    """The file name a symbol store uses for the name an image gives (a path
    written on Windows or here: its base name), or None when that is no safe
    file name."""
    base = file_name(name).strip()
    if base in ("", ".", "..") or ":" in base or "\0" in base or "/" in base or os.sep in base:
        return None
    return base


def compressed_name(name):
    """``x.pdb`` -> ``x.pd_``: the name symstore gives a compressed file."""
    return name[:-1] + "_" if len(name) > 1 else name


def inside(root, path):
    """True when ``path`` (links resolved) lies inside ``root``."""
    root = os.path.realpath(root)
    return os.path.commonpath([root, os.path.realpath(path)]) == root


def store_url(base, *parts):
    return base.rstrip("/") + "/" + "/".join(urllib.parse.quote(part, safe="") for part in parts)


def fetch(base_url, cache, name, key, kind, verify, limits, progress=None):
    """Fetch ``name`` (a :func:`cache_name`) of store key ``key`` from the server at
    ``base_url`` into ``cache/name/key/name``; that path.  ``kind``: ``pdb`` or
    ``image`` (what the first bytes must be); ``verify(path)`` raises BadInput when
    the finished file is not the one wanted.  A file already at the final path is
    kept (another process got there first) when it passes ``verify``."""
    directory = os.path.join(cache, name, key)
    final = os.path.join(directory, name)
    for path in (directory, final):
        if not inside(cache, path):
            raise DownloadError("refused to write %s: it is outside the symbol cache %s" % (path, cache))
    _make_directories(cache, directory)
    try:
        return _fetch_to(store_url(base_url, name, key, name), final, kind, verify, limits, progress)
    except DownloadError as error:
        if not error.missing:
            raise
    try:
        return _fetch_to(store_url(base_url, name, key, compressed_name(name)), final, "cab", verify, limits,
                         progress, expand=(name, kind))
    except DownloadError as error:
        if not error.missing:
            raise
    pointer_url = store_url(base_url, name, key, "file.ptr")
    pointer = _file_ptr(pointer_url, limits)
    if pointer is None:
        raise DownloadError("cannot download %s: HTTP 404 (nor %s nor file.ptr)"
                            % (store_url(base_url, name, key, name), compressed_name(name)), missing=True)
    return _fetch_to(pointer, final, kind, verify, limits, progress, local=not _is_url(pointer))


def _make_directories(cache, directory):
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as error:
        raise DownloadError("cannot create symbol cache folder %s: %s" % (directory, error.strerror or error))
    if not inside(cache, directory):
        raise DownloadError("refused to write into %s: a link leads it outside the symbol cache %s"
                            % (directory, cache))


def _is_url(text):
    return text.lower().startswith(("http://", "https://"))


def _file_ptr(url, limits):
    """Where ``file.ptr`` says the file is (a URL or a path), or None when the
    server has no file.ptr; its ``MSG:`` is a DownloadError."""
    try:
        response = urllib.request.urlopen(url, timeout=limits.timeout)
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return None
        raise DownloadError("cannot download %s: HTTP %d %s" % (url, error.code, error.reason))
    except (urllib.error.URLError, socket.timeout, OSError, ValueError) as error:
        raise DownloadError("cannot download %s: %s" % (url, getattr(error, "reason", None) or error))
    with response:
        text = response.read(MAX_FILE_PTR + 1)
    if len(text) > MAX_FILE_PTR:
        raise DownloadError("%s is longer than %d bytes: not a symbol server's file.ptr" % (url, MAX_FILE_PTR))
    line = text.decode("utf-8", "replace").strip().splitlines()[0] if text.strip() else ""
    if line.startswith("PATH:"):
        return line[5:].strip()
    if line.startswith("MSG:"):
        raise DownloadError("%s: the server says: %s" % (url, line[4:].strip()[:200]))
    raise DownloadError("%s says neither PATH: nor MSG:" % url)


def _fetch_to(source, final, kind, verify, limits, progress, expand=None, local=False):
    """Download (or copy, ``local``) ``source`` to a temporary file beside
    ``final``, expand it when it is a cabinet (``expand``: the name and kind of the
    file inside), verify it and link it into place."""
    directory = os.path.dirname(final)
    name = os.path.basename(final)
    with _Temporary(directory) as partial:
        opened = _open_local(source, limits) if local else _open_url(source, limits)
        with opened as (stream, total):
            _copy(stream, total, partial, source, kind, limits, progress, name)
        if expand is not None:
            with _Temporary(directory) as expanded:
                with open(partial.path, "rb") as cabinet, open(expanded.path, "wb") as output:
                    inner, _ = expand_cabinet(cabinet, output, source, limits.max_bytes)
                if inner.lower() != expand[0].lower():
                    raise DownloadError("%s holds %s, not %s" % (source, inner, expand[0]))
                _check_head(expanded.path, expand[1], "%s (expanded)" % source)
                return _install(expanded.path, final, verify)
        if kind == "cab":
            raise DownloadError("%s: a cabinet with nothing to expand it to" % source)
        return _install(partial.path, final, verify)


class _Opened(object):
    """(stream, total bytes or None) for a ``with``."""

    def __init__(self, stream, total):
        self.stream = stream
        self.total = total

    def __enter__(self):
        return self.stream, self.total

    def __exit__(self, *exc):
        self.stream.close()


def _open_url(url, limits):
    try:
        response = urllib.request.urlopen(url, timeout=limits.timeout)
    except urllib.error.HTTPError as error:
        raise DownloadError("cannot download %s: HTTP %d %s" % (url, error.code, error.reason),
                            missing=error.code == 404)
    except (urllib.error.URLError, socket.timeout, OSError, ValueError) as error:
        raise DownloadError("cannot download %s: %s" % (url, getattr(error, "reason", None) or error))
    total = _length(response)
    if total is not None and total > limits.max_bytes:
        response.close()
        raise DownloadError("refused %s: the server announces %d bytes, more than the %d allowed"
                            % (url, total, limits.max_bytes))
    return _Opened(response, total)


def _open_local(path, limits):
    try:
        handle = open(path, "rb")
        total = os.fstat(handle.fileno()).st_size
    except OSError as error:
        raise DownloadError("cannot read %s (named by file.ptr): %s" % (path, error.strerror or error))
    if total > limits.max_bytes:
        handle.close()
        raise DownloadError("refused %s: %d bytes, more than the %d allowed" % (path, total, limits.max_bytes))
    return _Opened(handle, total)


def _length(response):
    try:
        length = int(response.headers.get("Content-Length"))
    except (TypeError, ValueError):
        return None
    return length if length >= 0 else None


def _copy(stream, total, partial, source, kind, limits, progress, name):
    """The body into ``partial``, its first bytes checked before any is written."""
    started = time.monotonic()
    received = 0
    read = getattr(stream, "read1", stream.read)
    pending = b""
    checked = False
    report = _Progress(progress, name, total)
    try:
        while True:
            chunk = read(DOWNLOAD_CHUNK)
            if not chunk:
                break
            received += len(chunk)
            if received > limits.max_bytes:
                raise DownloadError("refused %s: more than %d bytes" % (source, limits.max_bytes))
            elapsed = time.monotonic() - started
            if elapsed > limits.deadline:
                raise DownloadError("gave up on %s: %d bytes in %.0f s, past the %.0f s deadline"
                                    % (source, received, elapsed, limits.deadline))
            if elapsed > limits.grace and received / elapsed < limits.minimum_rate:
                raise DownloadError("gave up on %s: %.0f bytes/s, slower than the minimum %d bytes/s"
                                    % (source, received / elapsed, limits.minimum_rate))
            if not checked:
                pending += chunk
                if len(pending) < HEAD_BYTES:
                    continue
                _refuse_unless(kind, pending, source)
                checked = True
                chunk, pending = pending, b""
            partial.handle.write(chunk)
            report(received)
        if not checked:
            _refuse_unless(kind, pending, source)
            partial.handle.write(pending)
        if total is not None and received < total:
            raise DownloadError("%s is truncated: %d of the %d bytes the server announced"
                                % (source, received, total))
        partial.handle.flush()
    except (socket.timeout, OSError, ValueError, http.client.HTTPException) as error:
        report(received, False)
        raise DownloadError("cannot download %s: %s after %d bytes" % (source, error or type(error).__name__,
                                                                        received))
    except BaseException:
        report(received, False)
        raise
    report(received, True)


def _refuse_unless(kind, head, source):
    """DownloadError saying what ``head`` is when it does not start a file of ``kind``."""
    if any(head.startswith(signature) for signature in SIGNATURES[kind]):
        return
    if not head:
        raise DownloadError("%s is an empty file, not %s" % (source, WHAT[kind]))
    text = head.lstrip().lower()
    if text.startswith((b"<!doctype html", b"<html", b"<head", b"<body", b"<?xml")):
        raise DownloadError("%s is an HTML page, not %s" % (source, WHAT[kind]))
    if any(signature.startswith(head) for signature in SIGNATURES[kind]):
        raise DownloadError("%s is truncated: %d bytes" % (source, len(head)))
    raise DownloadError("%s is not %s: it starts with %s" % (source, WHAT[kind], head[:8].hex(" ")))


def _check_head(path, kind, source):
    with open(path, "rb") as handle:
        _refuse_unless(kind, handle.read(HEAD_BYTES), source)


def _install(partial, final, verify):
    """Verify the finished file, then link it to ``final`` without replacing
    anything there; a file already there that passes ``verify`` is used."""
    verify(partial)
    try:
        os.link(partial, final)
    except FileExistsError:
        if is_link(final):
            raise DownloadError("refused to use %s: it is a link" % final)
        verify(final)  # another process stored it first
    except OSError:
        # A file system without hard links: rename, after checking nothing is there.
        if os.path.lexists(final):
            raise DownloadError("refused to replace %s" % final)
        os.rename(partial, final)
    return final


# -- temporary files, removed on failure, Ctrl-C and SIGTERM ---------------------------------

_LIVE_TEMPORARIES = set()
_LOCK = threading.Lock()


class _Temporary(object):
    """A new file in ``directory`` (never an existing name, never a link),
    removed when the ``with`` ends, whatever ends it, and on SIGTERM."""

    def __init__(self, directory):
        self.directory = directory
        self.path = None
        self.handle = None
        self._signal = None

    def __enter__(self):
        try:
            descriptor, self.path = tempfile.mkstemp(prefix=".download-", dir=self.directory)
        except OSError as error:
            raise DownloadError("cannot write into %s: %s" % (self.directory, error.strerror or error))
        self.handle = os.fdopen(descriptor, "wb")
        with _LOCK:
            _LIVE_TEMPORARIES.add(self.path)
        self._signal = _TerminationCleanup.enter()
        return self

    def __exit__(self, *exc):
        self.handle.close()
        try:
            os.remove(self.path)
        except OSError:
            pass
        with _LOCK:
            _LIVE_TEMPORARIES.discard(self.path)
        _TerminationCleanup.leave(self._signal)


class _TerminationCleanup(object):
    """While a download runs in the main thread, SIGTERM removes the temporary
    files first, then does what it did before (by default: ends the process)."""

    depth = 0
    previous = None

    @classmethod
    def enter(cls):
        if threading.current_thread() is not threading.main_thread():
            return False
        if cls.depth == 0:
            try:
                cls.previous = signal.signal(signal.SIGTERM, cls._handle)
            except (ValueError, OSError):
                return False
        cls.depth += 1
        return True

    @classmethod
    def leave(cls, entered):
        if not entered:
            return
        cls.depth -= 1
        if cls.depth == 0:
            signal.signal(signal.SIGTERM, cls.previous)
            cls.previous = None

    @classmethod
    def _handle(cls, number, frame):
        with _LOCK:
            for path in list(_LIVE_TEMPORARIES):
                try:
                    os.remove(path)
                except OSError:
                    pass
            _LIVE_TEMPORARIES.clear()
        previous = cls.previous
        if callable(previous):
            previous(number, frame)
            return
        if previous == signal.SIG_IGN:
            return
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


# -- progress ------------------------------------------------------------------------------------

class _Progress(object):
    """Calls ``callback(name, received, total, finished)`` (``finished``: None while
    going, True or False at the end) when there is one."""

    def __init__(self, callback, name, total):
        self.callback = callback
        self.name = name
        self.total = total
        self.ended = False

    def __call__(self, received, finished=None):
        if self.callback is None or self.ended:
            return
        self.ended = finished is not None
        self.callback(self.name, received, self.total, finished)


class ProgressBar(object):
    """A progress callback for the CLI: ``name [#####     ] 45% 1.2/2.7 MB``
    redrawn in place on one line of ``stream``; a stream that is not a terminal
    (a log, a pipe) gets only the closing line."""

    WIDTH = 30

    def __init__(self, stream):
        self.stream = stream
        self._shown = None
        isatty = getattr(stream, "isatty", None)
        self._live = bool(isatty and isatty())

    def __call__(self, name, received, total, finished):
        if finished is not None:
            outcome = "%.1f MB" % (received / 1e6) if finished else "failed"
            self.stream.write("%sdownloading %s: %s\n" % ("\r" if self._live and self._shown else "", name,
                                                          outcome))
            self.stream.flush()
            self._shown = None
            return
        if not self._live:
            return
        if total:
            percent = min(100, received * 100 // total)
            if (name, percent) == self._shown:
                return
            self._shown = (name, percent)
            filled = self.WIDTH * percent // 100
            text = "%s [%s%s] %3d%% %.1f/%.1f MB" % (name, "#" * filled, " " * (self.WIDTH - filled), percent,
                                                     received / 1e6, total / 1e6)
        else:
            self._shown = (name, received)
            text = "%s %.1f MB" % (name, received / 1e6)
        self.stream.write("\rdownloading " + text)
        self.stream.flush()
