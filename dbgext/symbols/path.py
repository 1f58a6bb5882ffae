"""The symbol path, in WinDbg's syntax, and the symbol store behind it.

``--symbols`` (repeatable) and ``_NT_SYMBOL_PATH`` hold ``;``-separated elements:

* a directory: ISF files (``nt.json``) and PDBs, looked for as ``DIR/name.pdb``,
  ``DIR/<ext>/name.pdb`` and in symbol-store layout ``DIR/name.pdb/<key>/name.pdb``;
* a file: an ISF file, or a ``.pdb`` (used for the module whose CodeView record it matches);
* ``srv*CACHE*URL`` (or ``srv*URL``, ``srv*DIR``, ``symsrv*symsrv.dll*CACHE*URL``):
  a symbol server; files are looked for in the local stores first and downloaded
  from ``URL`` into ``CACHE``;
* ``cache*DIR``: where downloads of the elements after it go (searched too).

A PDB is used only when its GUID and age match the module's CodeView (RSDS)
record; a file that does not match is refused with WinDbg's "mismatched PDB"
message and the search goes on.  The same store gives module images
(``name.sys/<TimeDateStamp><SizeOfImage>/name.sys``).

Downloads happen only when the path names a URL and ``no_download`` is off; they
show a progress bar on stderr and give up after ``timeout`` seconds of silence.
"""

import os
import sys
import tempfile
from collections import OrderedDict

from ..errors import BadInput
from .isf import is_isf_name

DEFAULT_CACHE = os.path.join("~", ".cache", "dbgext", "symbols")
DOWNLOAD_TIMEOUT = 30.0
DOWNLOAD_CHUNK = 1 << 16
MAX_DOWNLOAD = 4 << 30   # no PDB or image is bigger; a server that streams forever is cut off


class PathElement(object):
    """One element: ``kind`` is ``dir``, ``file`` or ``server`` (``stores``: local
    stores, the first being the download cache; ``url`` or None)."""

    __slots__ = ("kind", "path", "stores", "url")

    def __init__(self, kind, path=None, stores=(), url=None):
        self.kind = kind
        self.path = path
        self.stores = list(stores)
        self.url = url

    def __repr__(self):
        return "PathElement(%r, %r, %r, %r)" % (self.kind, self.path, self.stores, self.url)


def _is_url(text):
    return text.lower().startswith(("http://", "https://"))


def parse_symbol_path(text, default_cache=None):
    """The elements of one symbol path string, in order."""
    default_cache = default_cache or os.path.expanduser(DEFAULT_CACHE)
    elements = []
    cache = None
    for raw in text.split(";"):
        item = raw.strip().strip('"')
        if not item:
            continue
        parts = item.split("*")
        head = parts[0].lower()
        if head == "cache" and len(parts) >= 2:
            cache = parts[1] or default_cache
            elements.append(PathElement("dir", cache))
            continue
        if head in ("srv", "symsrv"):
            rest = [part for part in parts[1:] if not part.lower().endswith(".dll")]
            url = rest.pop() if rest and _is_url(rest[-1]) else None
            stores = [store or default_cache for store in rest] or [cache or default_cache]
            elements.append(PathElement("server", stores=stores, url=url))
            continue
        if _is_url(item):
            elements.append(PathElement("server", stores=[cache or default_cache], url=item))
            continue
        elements.append(PathElement("dir" if os.path.isdir(item) else "file", item))
    return elements


# URLs that failed in this process: batch triage opens many dumps of one build and
# must not wait for the same missing file (or dead server) once per dump.
FAILED_DOWNLOADS = set()


class SymbolLocator(object):
    """Finds a module's PDB (or image) along the symbol path, downloading when allowed."""

    def __init__(self, elements, no_download=False, timeout=DOWNLOAD_TIMEOUT, progress=None):
        self.elements = list(elements)
        self.no_download = no_download
        self.timeout = timeout
        self.progress = progress if progress is not None else sys.stderr

    @property
    def isf_paths(self):
        """ISF files and the directories to look for them in."""
        return [element.path for element in self.elements
                if element.kind == "dir" or (element.kind == "file" and is_isf_name(element.path))]

    @property
    def may_download(self):
        return not self.no_download and any(element.url for element in self.elements)

    # -- PDBs ------------------------------------------------------------------------------

    def find_pdb(self, codeview, report):
        """An open :class:`~dbgext.symbols.pdb.PdbFile` matching ``codeview`` (GUID,
        age, PDB name), or None.  ``report(kind, message)`` hears about files that
        could not be used."""
        name = _base_name(codeview.pdb_name)
        key = codeview.symbol_server_key
        for candidate in self._candidates(name, key, lambda element: element.kind == "file"
                                          and element.path.lower().endswith(".pdb")):
            found = _open_matching(candidate, codeview, report)
            if found is not None:
                return found
        for element in self.elements:
            if element.kind != "server" or not element.url:
                continue
            path = self._download(element, name, key, report)
            if path is not None:
                found = _open_matching(path, codeview, report)
                if found is not None:
                    return found
                report("mismatched_pdb_downloaded", "%s from %s does not match; removed" % (name, element.url))
                _remove(path)
        return None

    def _candidates(self, name, key, take_file):
        """Local paths to try, in path order, that exist."""
        extension = os.path.splitext(name)[1].lstrip(".")
        seen = set()
        for element in self.elements:
            if element.kind == "file":
                paths = [element.path] if take_file(element) else []
            elif element.kind == "dir":
                paths = [os.path.join(element.path, name), os.path.join(element.path, name, key, name)]
                if extension:
                    paths.append(os.path.join(element.path, extension, name))
            else:
                paths = [os.path.join(store, name, key, name) for store in element.stores]
            for path in paths:
                if path not in seen and os.path.isfile(path):
                    seen.add(path)
                    yield path

    # -- images ----------------------------------------------------------------------------

    def find_image(self, image_name, timestamp, size_of_image, report):
        """The path of a module image (``name.sys/<TimeDateStamp><SizeOfImage>/name.sys``)
        in the stores or downloaded, or None."""
        name = _base_name(image_name)
        key = "%08X%x" % (timestamp, size_of_image)
        for path in self._candidates(name, key, lambda element: _base_name(element.path).lower() == name.lower()):
            if _image_matches(path, timestamp, size_of_image):
                return path
        for element in self.elements:
            if element.kind == "server" and element.url:
                path = self._download(element, name, key, report)
                if path is not None:
                    return path
        return None

    # -- downloads --------------------------------------------------------------------------

    def _download(self, element, name, key, report):
        """Fetch ``URL/name/key/name`` into the element's cache; the path or None."""
        if self.no_download:
            return None
        url = "%s/%s/%s/%s" % (element.url.rstrip("/"), name, key, name)
        if url in FAILED_DOWNLOADS:
            return None
        target = os.path.join(element.stores[0], name, key, name)
        try:
            return _fetch(url, target, self.timeout, self.progress)
        except BadInput as error:
            FAILED_DOWNLOADS.add(url)
            report("symbol_download_failed", str(error))
            return None


def _fetch(url, target, timeout, progress):
    import socket
    import urllib.error
    import urllib.request
    directory = os.path.dirname(target)
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as error:
        raise BadInput("cannot create symbol cache %s: %s" % (directory, error.strerror or error))
    try:
        response = urllib.request.urlopen(url, timeout=timeout)
    except urllib.error.HTTPError as error:
        raise BadInput("cannot download %s: HTTP %d %s" % (url, error.code, error.reason))
    except (urllib.error.URLError, socket.timeout, OSError, ValueError) as error:
        raise BadInput("cannot download %s: %s" % (url, getattr(error, "reason", None) or error))
    handle, partial = tempfile.mkstemp(prefix=".download-", dir=directory)
    bar = ProgressBar(progress, os.path.basename(target), _length(response))
    try:
        with response, os.fdopen(handle, "wb") as output:
            received = 0
            while True:
                chunk = response.read(DOWNLOAD_CHUNK)
                if not chunk:
                    break
                received += len(chunk)
                if received > MAX_DOWNLOAD:
                    raise BadInput("cannot download %s: more than %d bytes" % (url, MAX_DOWNLOAD))
                output.write(chunk)
                bar.update(received)
        bar.finish(received)
        os.replace(partial, target)
    except (OSError, socket.timeout) as error:
        bar.finish(None)
        _remove(partial)
        raise BadInput("cannot download %s: %s" % (url, getattr(error, "strerror", None) or error))
    except BaseException:
        bar.finish(None)
        _remove(partial)
        raise
    return target


def _length(response):
    try:
        return int(response.headers.get("Content-Length"))
    except (TypeError, ValueError):
        return None


class ProgressBar(object):
    """``name [#####     ] 45% 1.2/2.7 MB`` redrawn in place on one stderr line; a
    stream that is not a terminal (a log, a pipe) gets only the closing line."""

    WIDTH = 30

    def __init__(self, stream, name, total):
        self.stream = stream
        self.name = name
        self.total = total
        self._shown = -1
        isatty = getattr(stream, "isatty", None)
        self._live = bool(isatty and isatty())

    def update(self, received):
        if not self._live:
            return
        if self.total:
            percent = min(100, received * 100 // self.total)
            if percent == self._shown:
                return
            self._shown = percent
            filled = self.WIDTH * percent // 100
            text = "%s [%s%s] %3d%% %.1f/%.1f MB" % (self.name, "#" * filled, " " * (self.WIDTH - filled), percent,
                                                     received / 1e6, self.total / 1e6)
        else:
            text = "%s %.1f MB" % (self.name, received / 1e6)
        self.stream.write("\rdownloading " + text)
        self.stream.flush()

    def finish(self, received):
        outcome = "%.1f MB" % (received / 1e6) if received is not None else "failed"
        self.stream.write("%sdownloading %s: %s\n" % ("\r" if self._live else "", self.name, outcome))
        self.stream.flush()


def _remove(path):
    try:
        os.remove(path)
    except OSError:
        pass


def _base_name(path):
    """The file name of a path written on Windows or here."""
    return path.replace("\\", "/").rsplit("/", 1)[-1]


def _open_matching(path, codeview, report):
    try:
        pdb = open_pdb(path)
        if pdb.matches(codeview.guid, codeview.age):
            return pdb
    except BadInput as error:
        report("bad_symbol_file", str(error))
        return None
    report("mismatched_pdb", "mismatched PDB %s: it is {%s} age %d, the module wants {%s} age %d"
           % (path, pdb.guid_text, pdb.dbi_age, codeview.guid_text, codeview.age))
    return None


# PDBs stay open and parsed across the targets of one process (batch triage opens
# the same nt.pdb for every dump of a build); the file's size and mtime are part
# of the key, so a rewritten file is read again.
_OPEN_PDBS = OrderedDict()
MAX_OPEN_PDBS = 16


def open_pdb(path):
    """A :class:`~dbgext.symbols.pdb.PdbFile` for ``path``, shared while the file is unchanged."""
    from .pdb import PdbFile
    try:
        status = os.stat(path)
    except OSError as error:
        raise BadInput("cannot read %s: %s" % (path, error.strerror or error))
    key = (os.path.realpath(path), status.st_size, status.st_mtime_ns)
    pdb = _OPEN_PDBS.pop(key, None)
    if pdb is None or pdb.closed:
        pdb = PdbFile(path)
    _OPEN_PDBS[key] = pdb
    while len(_OPEN_PDBS) > MAX_OPEN_PDBS:
        _OPEN_PDBS.popitem(last=False)[1].close()
    return pdb


def _image_matches(path, timestamp, size_of_image):
    from ..pe import PEImage
    try:
        image = PEImage.from_file(path)
    except BadInput:
        return False
    return image.timestamp == timestamp and image.size_of_image == size_of_image


def symbol_path_elements(option_paths, beside, environ=None):
    """The symbol path of a run: ``--symbols`` values when given (each may be a
    ``;`` list), else the dump's own symbol directories then ``_NT_SYMBOL_PATH``."""
    environ = os.environ if environ is None else environ
    if option_paths is not None:
        texts = list(option_paths)
    else:
        texts = list(beside) + [environ.get("_NT_SYMBOL_PATH", "")]
    elements = []
    for text in texts:
        elements.extend(parse_symbol_path(text))
    return elements
