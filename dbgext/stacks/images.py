"""Where the unwinder gets a module's unwind data and code: the image in target
memory, or — when the dump lacks it (small dumps, minidumps) — a PE file found by
an *image loader*: the one given (``k --image-path``), then the symbol path's
image store (``name.sys/<TimeDateStamp><SizeOfImage>/name.sys``).

Each module is loaded once per walker.  Its ``.pdata`` becomes a sorted table for
binary search; entries that cannot be right (end before begin, outside the image,
overlapping) are dropped and reported once, so a corrupt directory costs one
problem, not a wrong frame.

A module in target memory is never read whole (:class:`TargetImage`): over a live
kernel debugging connection reading ntoskrnl's 11 MB would take minutes, and a
walk needs its header page, its ``.pdata``, a few UNWIND_INFOs and a few code
windows.
"""

import bisect
import os
import struct

from ..errors import BadInput, UnreadableMemory
from ..pe import DIRECTORY_EXCEPTION, PEImage
from ..problems import ProblemLog
from ..winpath import file_name
from . import arm64_unwind
from .x64 import EPILOGUE_WINDOW

RUNTIME_FUNCTION = struct.Struct("<III")
PDATA_ENTRY_SIZE = {"x64": RUNTIME_FUNCTION.size, "arm64": arm64_unwind.PDATA_ENTRY_SIZE}


def runtime_functions(image):
    """The exception directory (``.pdata``) of ``image`` — a PE file
    (:class:`~dbgext.pe.PEImage`) or a module in target memory
    (:class:`TargetImage`) — as (begin RVA, end RVA, unwind word) per function,
    in the file's order: x64 RUNTIME_FUNCTIONs as they are; ARM64 entries with
    their end read from the packed length or the ``.xdata`` header
    (:func:`~dbgext.stacks.arm64_unwind.runtime_functions`).  What cannot be
    read is reported in ``image.problems``; other architectures have none."""
    entry_size = PDATA_ENTRY_SIZE.get(image.arch)
    if entry_size is None:
        return []
    rva, size = image.directory(DIRECTORY_EXCEPTION)
    size -= size % entry_size
    if not rva or size <= 0:
        return []
    data = image.read_backed(rva, size)
    data = data[:len(data) - len(data) % entry_size]
    if len(data) < size:
        image.problems.add("pe_directory_unreadable", image.image_base + rva + len(data),
                           "%s: the exception directory claims 0x%x bytes; the %s holds %d entries of it"
                           % (image.name, size, image.origin, len(data) // entry_size))
    if image.arch == "arm64":
        return arm64_unwind.runtime_functions(image, data)
    return list(RUNTIME_FUNCTION.iter_unpack(data))


class TargetImage(object):
    """What the unwinder reads of a module in target memory — the exception
    directory, UNWIND_INFO, code — fetched on demand through the target's page
    cache.  It answers the few :class:`~dbgext.pe.PEImage` calls the unwind-data
    parser and :func:`runtime_functions` make (``unpack``, ``read_partial``,
    ``read_backed``, ``directory``, ``describe``, ``size_of_image``); ``headers`` is
    a PEImage of the module's header page."""

    describe = PEImage.describe
    origin = "memory"

    def __init__(self, target, module, headers):
        self.target = target
        self.name = module.name
        self.image_base = module.base
        self.arch = headers.arch
        self.size_of_image = headers.size_of_image
        self.headers = headers
        self.problems = ProblemLog()

    def unpack(self, fmt, rva):
        try:
            return struct.unpack(fmt, self.target.read(self.image_base + rva, struct.calcsize(fmt)))
        except UnreadableMemory:
            return None

    def read_partial(self, rva, size):
        """The bytes at ``rva`` up to ``size``, stopping at the first unreadable one."""
        read = self.target.try_read(self.image_base + rva, size)
        return read.data[:read.holes[0][0] - read.address] if read.holes else read.data

    def directory(self, index):
        return self.headers.directory(index)

    # Target memory has no zero-filled section tails to stop at: what is
    # readable is what the module holds.
    read_backed = read_partial


class ModuleCode(object):
    """A module's image (or None) and its RUNTIME_FUNCTIONs sorted by begin RVA."""

    __slots__ = ("module", "image", "entries", "begins", "info_cache", "corrupt", "_windows")

    def __init__(self, module, image, entries, corrupt=False):
        self.module = module
        self.image = image
        self.entries = entries
        self.begins = [entry[0] for entry in entries]
        self.info_cache = {}  # unwind rva -> UnwindInfo
        # Entries were dropped: a function without one may have lost it rather
        # than be a leaf, so the walker scans there instead of popping [rsp].
        self.corrupt = corrupt
        self._windows = {}    # rva -> the code there an epilogue check reads

    @property
    def has_unwind_data(self):
        return bool(self.entries)

    def function_entry(self, rva):
        """The RUNTIME_FUNCTION covering ``rva``, or None (a leaf, or not code)."""
        index = bisect.bisect_right(self.begins, rva) - 1
        if index >= 0 and rva < self.entries[index][1]:
            return self.entries[index]
        return None

    def code(self, rva, size):
        """The code bytes at ``rva`` (up to ``size``; fewer where unreadable)."""
        return self.image.read_partial(rva, size) if self.image is not None else b""

    def code_window(self, rva):
        """The code at ``rva`` an epilogue check needs, remembered: walks meet the
        same return addresses again and again."""
        window = self._windows.get(rva)
        if window is None:
            window = self._windows[rva] = self.code(rva, EPILOGUE_WINDOW)
        return window


class Images(object):
    """Module lookup by address and each module's :class:`ModuleCode`, loaded on
    first use.  ``image_loader(module)`` -> PEImage or None supplies an image from
    elsewhere when the target's copy has no readable unwind data."""

    def __init__(self, target, problems, image_loader=None):
        self.target = target
        self.problems = problems
        self.loaders = [loader for loader in (image_loader, images_from_symbol_store(target)) if loader]
        self.modules = target.modules()          # sorted by base
        self._bases = [module.base for module in self.modules]
        self._loaded = {}

    def module_at(self, address):
        index = bisect.bisect_right(self._bases, address) - 1
        if index >= 0 and self.modules[index].contains(address):
            return self.modules[index]
        return None

    def code_for(self, module):
        found = self._loaded.get(module.base)
        if found is None:
            found = self._loaded[module.base] = self._load(module)
        return found

    def _load(self, module):
        image = self._from_target(module)
        entries, corrupt = self._entries(image) if image is not None else ([], False)
        for loader in self.loaders:
            if entries:
                break
            try:
                loaded = loader(module)
            except BadInput as error:
                self.problems.add("image_file_unreadable", module.base, str(error), "warning")
                loaded = None
            if loaded is not None and loaded.arch == self.target.arch:
                image = loaded
                entries, corrupt = self._entries(loaded)
        # No image, or none with unwind data: the walk says so once (no_unwind_data).
        return ModuleCode(module, image, entries, corrupt)

    def lacks_unwind_data(self, module):
        """True when the module was needed and no image with unwind data was found."""
        loaded = self._loaded.get(module.base)
        return loaded is not None and not loaded.has_unwind_data

    def _from_target(self, module):
        from ..symbols.match import image_headers
        headers = image_headers(self.target, module)
        return TargetImage(self.target, module, headers) if headers is not None else None

    def _entries(self, image):
        """(the image's .pdata sorted without impossible entries, whether any were
        dropped); dropped entries are reported once."""
        functions = sorted(runtime_functions(image))     # first: reading them may add problems to the image's
        self.problems.extend(problem for problem in image.problems if problem.kind != "pe_truncated")
        # ARM64 entries whose extent could not be read were left out by the reader.
        unreadable = sum(1 for problem in image.problems if problem.kind == "pdata_entry_unreadable")
        entries = []
        bad = 0
        # An ARM64 entry's word is packed unwind data or an RVA function_table has read through.
        words_are_rvas = image.arch != "arm64"
        for begin, end, unwind in functions:
            if not begin < end <= image.size_of_image or (
                    words_are_rvas and not 0 < unwind < image.size_of_image) or (
                    entries and begin < entries[-1][1]):
                bad += 1
                continue
            entries.append((begin, end, unwind))
        if bad:
            self.problems.add("pdata_corrupt", image.image_base,
                              "%s: %d of %d .pdata entries are impossible (outside the image, empty or "
                              "overlapping) and were ignored" % (image.name, bad, bad + len(entries)))
        return entries, bool(bad or unreadable)


def images_from_symbol_store(target):
    """An image loader asking the target's symbol path for the module's image by
    its TimeDateStamp and SizeOfImage (from its headers, else the loader's list),
    or None without a symbol path."""
    symbols = target.symbols
    locator = getattr(symbols, "locator", None)
    if locator is None:
        return None
    from ..symbols.match import image_identity

    def load(module):
        identity = image_identity(target, module)
        if identity is None:
            return None
        path = locator.find_image(module.image, identity[0], identity[1], symbols.report)
        return PEImage.from_file(path, module.name) if path else None
    return load


def images_from_directories(directories):
    """An image loader looking for ``<module image name>`` (``ntoskrnl.exe``,
    ``mydrv.sys``) in ``directories`` — WinDbg's executable image path."""
    def load(module):
        for directory in directories:
            path = os.path.join(directory, file_name(module.image))
            if os.path.isfile(path):
                return PEImage.from_file(path, module.name)
        return None
    return load
