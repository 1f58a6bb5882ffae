"""An in-memory sparse image: pages held in a dict.  Unit tests and the scenario
builder use it; it is also what a dump backend degenerates to once loaded."""

from .base import PAGE_SIZE, Backend
from ..symbols.table import SymbolTable


class ImageBackend(Backend):
    kind = "image"

    def __init__(self, pages, arch="x64", modules=(), symbols=None, info=None, threads=()):
        """``pages``: {page-aligned address: bytes of PAGE_SIZE}; ``threads``: Thread
        objects, the first being the current one."""
        self.arch = arch
        self._pages = pages
        self._modules = list(modules)
        self._symbols = symbols if symbols is not None else SymbolTable()
        self._info = dict(info or {})
        self._threads = list(threads)

    def read_page(self, page_address):
        page = self._pages.get(page_address)
        return bytes(page) if page is not None else None

    def mapped_ranges(self):
        ranges = []
        for page in sorted(self._pages):
            if ranges and ranges[-1][1] == page:
                ranges[-1][1] = page + PAGE_SIZE
            else:
                ranges.append([page, page + PAGE_SIZE])
        return [tuple(r) for r in ranges]

    def modules(self):
        return list(self._modules)

    def symbols(self):
        return self._symbols

    def info(self):
        info = {"kind": self.kind, "arch": self.arch}
        info.update(self._info)
        return info

    def threads(self):
        return list(self._threads)

    def current_thread(self):
        return self._threads[0] if self._threads else None
