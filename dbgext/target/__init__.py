"""The memory layer: one Target protocol over pykd, kernel dumps, minidumps and
in-memory images."""

import os

from ..errors import BadInput
from .base import PAGE_SIZE, Backend, Module, PartialRead, Target, Thread
from .symbols import SymbolTable, load_isf_directory

__all__ = ["PAGE_SIZE", "Backend", "Module", "PartialRead", "Target", "Thread", "SymbolTable", "open_dump",
           "symbol_paths_beside"]


def symbol_paths_beside(path):
    """ISF directories that belong to a dump: ``<dump>.symbols/`` or ``symbols/`` next to it."""
    candidates = [path + ".symbols", os.path.join(os.path.dirname(os.path.abspath(path)), "symbols")]
    return [c for c in candidates if os.path.isdir(c)]


def open_dump(path, symbols=None, cache_pages=8192):
    """Open a dump file, choosing the backend from the file's signature.

    ``symbols``: ISF files/directories; None means "look beside the dump"."""
    try:
        with open(path, "rb") as handle:
            magic = handle.read(8)
    except OSError as error:
        raise BadInput("cannot open %s: %s" % (path, error.strerror or error))
    if magic[:4] == b"PAGE":
        from .kdump import open_kernel_dump
        backend = open_kernel_dump(path)
    elif magic[:4] == b"MDMP":
        from .minidump import MinidumpBackend
        backend = MinidumpBackend(path)
    else:
        raise BadInput("%s is not a Windows dump (signature %r)" % (path, magic[:8]))
    paths = symbol_paths_beside(path) if symbols is None else list(symbols)
    table = load_isf_directory(paths) if paths else SymbolTable()
    table.bind(backend.modules())
    return Target(backend, cache_pages=cache_pages, symbols=table)
