"""Paths as Windows writes them and as given here are read one way."""

import pytest

from dbgext.winpath import file_name, file_stem


@pytest.mark.parametrize("path, name, stem", [
    ("\\SystemRoot\\System32\\drivers\\amdppm.sys", "amdppm.sys", "amdppm"),
    ("C:\\Windows\\System32\\ntdll.dll", "ntdll.dll", "ntdll"),
    ("/srv/images/mydrv.sys", "mydrv.sys", "mydrv"),
    ("ntoskrnl.exe", "ntoskrnl.exe", "ntoskrnl"),
    ("hal", "hal", "hal"),
    ("archive.tar.gz", "archive.tar.gz", "archive.tar"),
    ("dir\\", "", ""),
])
def test_the_file_name_is_the_last_component_and_the_stem_drops_one_extension(path, name, stem):
    assert (file_name(path), file_stem(path)) == (name, stem)
