"""Paths as Windows writes them, read here too.

A module list, a small dump's string pool or a PDB's CodeView record names files
with backslashes (``\\SystemRoot\\System32\\drivers\\amdppm.sys``); paths given on
the command line use this machine's separator.  Both are read the same way.
"""


def file_name(path):
    """The last component of a path written on Windows or here
    (``\\SystemRoot\\System32\\drivers\\amdppm.sys`` -> ``amdppm.sys``)."""
    return path.replace("/", "\\").rpartition("\\")[2]


def file_stem(path):
    """The file name without its extension: the name WinDbg gives a module
    (``\\SystemRoot\\System32\\drivers\\ACPI.sys`` -> ``ACPI``)."""
    name = file_name(path)
    stem, dot, _ = name.rpartition(".")
    return stem if dot else name
