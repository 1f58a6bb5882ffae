"""The memory layer: one Target protocol over pykd, kernel dumps, minidumps and
in-memory images."""

import os

from ..errors import BadInput
from .base import PAGE_SIZE, Backend, Module, PartialRead, Target, Thread
from ..symbols.table import SymbolTable, open_symbol_table

__all__ = ["PAGE_SIZE", "Backend", "Module", "PartialRead", "Target", "Thread", "SymbolTable", "open_dump",
           "symbol_paths_beside"]


def symbol_paths_beside(path):
    """ISF directories that belong to a dump: ``<dump>.symbols/`` or ``symbols/`` next to it."""
    candidates = [path + ".symbols", os.path.join(os.path.dirname(os.path.abspath(path)), "symbols")]
    return [c for c in candidates if os.path.isdir(c)]


def open_kernel_dump(path):
    """The backend for the kernel dump at ``path``: a small memory dump's or a
    physical-memory dump's, by the header's DumpType.  (Imported here, when a
    kernel dump is opened: WinDbg's !py starts every command afresh.)"""
    from ..layouts.dump_formats import DUMP_TYPE_TRIAGE
    from .dumpfile import DumpFile
    from .kdump import KernelDumpBackend, KernelDumpHeader
    from .triage_dump import TriageDumpBackend
    dump_file = DumpFile(path)
    try:
        header = KernelDumpHeader(dump_file)
        if header.dump_type == DUMP_TYPE_TRIAGE:
            return TriageDumpBackend(dump_file, header)
        return KernelDumpBackend(dump_file, header)
    except BaseException:
        dump_file.close()
        raise


def open_dump(path, symbols=None, cache_pages=8192, no_download=False, diagnostics=None):
    """Open a dump file, choosing the backend from the file's signature.

    ``symbols``: symbol path elements (ISF files, PDBs, directories, ``srv*CACHE*URL``;
    see :mod:`dbgext.symbols.path`); None means "beside the dump, then _NT_SYMBOL_PATH".
    ``no_download``: never fetch from a symbol server; ``diagnostics``: the CLI's
    Output for symbol warnings and download progress (default: none — problems go to
    ``target.symbols.problems`` and ``logging``, downloads are silent)."""
    try:
        with open(path, "rb") as handle:
            magic = handle.read(8)
    except OSError as error:
        raise BadInput("cannot open %s: %s" % (path, error.strerror or error))
    if magic[:4] == b"PAGE":
        backend = open_kernel_dump(path)
    elif magic[:4] == b"MDMP":
        from .minidump import MinidumpBackend
        backend = MinidumpBackend(path)
    else:
        raise BadInput("%s is not a Windows dump (signature %r)" % (path, magic[:8]))
    try:
        table = open_symbol_table(symbols, symbol_paths_beside(path), no_download, diagnostics=diagnostics)
        table.bind(backend.modules())
        target = Target(backend, cache_pages=cache_pages, symbols=table)
        table.attach(target)
    except BaseException:
        backend.close()  # a bad symbol path must not leave the dump open
        raise
    return target
