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

Names are compared without regard to case (``XRay.pdb`` finds ``xray.pdb``).
Downloads happen only when the path names a URL and ``no_download`` is off; how
they are made safe against a hostile server or image is :mod:`dbgext.symbols.download`.
"""

import os
from collections import OrderedDict

from ..errors import BadInput
from ..pe import PEImage
from ..winpath import file_name
from .download import Limits, cache_name, fetch, store_url
from .isf import is_isf_name
from .pdb import PdbFile

DEFAULT_CACHE = os.path.join("~", ".cache", "dbgext", "symbols")


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
MAX_LISTED = 4096  # entries of one folder compared case-insensitively


class SymbolLocator(object):
    """Finds a module's PDB (or image) along the symbol path, downloading when
    allowed.  ``limits``: a :class:`~dbgext.symbols.download.Limits` (timeout,
    deadline, minimum rate, size cap); ``progress``: a callback for download
    progress (:class:`~dbgext.symbols.download.ProgressBar` in the CLI), None for
    silence."""

    def __init__(self, elements, no_download=False, limits=None, progress=None):
        self.elements = list(elements)
        self.no_download = no_download
        self.limits = limits if limits is not None else Limits()
        self.progress = progress

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
        name = cache_name(codeview.pdb_name)
        if name is None:
            report("symbol_name_refused", "refused the PDB name %r the image gives: not a file name"
                   % codeview.pdb_name)
            return None
        key = codeview.symbol_server_key
        for candidate in self._candidates(name, key, lambda element: element.kind == "file"
                                          and element.path.lower().endswith(".pdb")):
            found = _open_matching(candidate, codeview, report)
            if found is not None:
                return found

        def verify(path):
            _verify_pdb(path, codeview)

        for element in self.elements:
            if element.kind == "server" and element.url:
                path = self._download(element, name, key, "pdb", verify, report)
                found = _open_matching(path, codeview, report) if path is not None else None
                if found is not None:
                    return found
        return None

    def _candidates(self, name, key, take_file):
        """Local paths to try, in path order, that exist (names compared without case)."""
        extension = os.path.splitext(name)[1].lstrip(".")
        seen = set()
        for element in self.elements:
            if element.kind == "file":
                paths = [element.path] if take_file(element) else []
            elif element.kind == "dir":
                paths = [_find(element.path, (name,)), _find(element.path, (name, key, name))]
                if extension:
                    paths.append(_find(element.path, (extension, name)))
            else:
                paths = [_find(store, (name, key, name)) for store in element.stores]
            for path in paths:
                if path is not None and path not in seen and os.path.isfile(path):
                    seen.add(path)
                    yield path

    # -- images ----------------------------------------------------------------------------

    def find_image(self, image_name, timestamp, size_of_image, report):
        """The path of a module image (``name.sys/<TimeDateStamp><SizeOfImage>/name.sys``)
        in the stores or downloaded, or None."""
        name = cache_name(image_name)
        if name is None:
            report("symbol_name_refused", "refused the image name %r: not a file name" % image_name)
            return None
        key = "%08X%x" % (timestamp, size_of_image)
        for path in self._candidates(name, key, lambda element: file_name(element.path).lower() == name.lower()):
            if _image_matches(path, timestamp, size_of_image):
                return path

        def verify(path):
            if not _image_matches(path, timestamp, size_of_image):
                raise BadInput("%s is not the image with TimeDateStamp %08X and SizeOfImage %x"
                               % (path, timestamp, size_of_image))

        for element in self.elements:
            if element.kind == "server" and element.url:
                path = self._download(element, name, key, "image", verify, report)
                if path is not None:
                    return path
        return None

    # -- downloads --------------------------------------------------------------------------

    def _download(self, element, name, key, kind, verify, report):
        """Fetch ``URL/name/key/name`` into the element's cache; the path or None."""
        if self.no_download:
            return None
        url = store_url(element.url, name, key, name)
        if url in FAILED_DOWNLOADS:
            return None
        try:
            return fetch(element.url, element.stores[0], name, key, kind, verify, self.limits, self.progress)
        except BadInput as error:
            FAILED_DOWNLOADS.add(url)
            report("symbol_download_failed", str(error))
            return None


def _find(root, parts):
    """``root/parts...`` with each part matched without regard to case (a store
    written on Windows, read here), or None."""
    path = root
    for part in parts:
        exact = os.path.join(path, part)
        if os.path.exists(exact):
            path = exact
            continue
        try:
            entries = os.listdir(path)
        except OSError:
            return None
        wanted = part.lower()
        matches = sorted(entry for entry in entries[:MAX_LISTED] if entry.lower() == wanted)
        if not matches:
            return None
        path = os.path.join(path, matches[0])
    return path


def _verify_pdb(path, codeview):
    """BadInput unless ``path`` is a PDB that ``codeview`` names."""
    pdb = PdbFile(path)
    try:
        if not pdb.matches(codeview.guid, codeview.age):
            raise BadInput("the downloaded %s is the PDB of another build: {%s} age %d, the module wants {%s} age %d"
                           % (codeview.pdb_name, pdb.guid_text, pdb.dbi_age, codeview.guid_text, codeview.age))
    finally:
        pdb.close()


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
