"""The Wine oracle: real Windows x64 programs (tests/data/stacks/wine/oracle.c,
built with MinGW gcc -O0/-O2 and clang -O2 with and without frame pointers), run
under Wine, recorded their own true call chains (each function stores
``__builtin_return_address(0)`` on entry) and wrote minidumps of themselves
through dbghelp's ``MiniDumpWriteDump`` — from a second thread while the main
thread was parked, and from an unhandled-exception filter after a fault.  The
chain runs through recursion, a frame beyond a page (stack probe), alloca and a
function keeping doubles in saved XMM registers.

Given the images, ``k`` must give the recorded chain frame for frame, every frame
found by the images' unwind data.  The fixtures (images, gzipped minidumps,
chains) are rebuilt by ``tests/data/stacks/wine/rebuild.sh``; the test needs no
Wine."""

import gzip
import os
import shutil

import pytest

import dbgext
from dbgext.pe import PEImage
from dbgext.stacks import analyze, images_from_directories

WINE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "stacks", "wine")
BUILDS = ("mingw-O0", "mingw-O2", "clang-O2", "clang-fp")
RUNS = ("", "-fault")   # the parked main thread, and the faulting thread
CHAIN_LENGTH = {"": 11, "-fault": 12}


def recorded_chain(name):
    with open(os.path.join(WINE, name + ".chain")) as handle:
        return [int(line, 16) for line in handle if line.strip()]


def walked(name, tmp_path, with_images=True, symbols=None):
    dump = str(tmp_path / (name + ".dmp"))
    with gzip.open(os.path.join(WINE, name + ".dmp.gz"), "rb") as source, open(dump, "wb") as copy:
        shutil.copyfileobj(source, copy)
    with dbgext.open(dump, symbols=symbols) as target:
        return analyze(target, image_loader=images_from_directories([WINE]) if with_images else None)


@pytest.mark.parametrize("run", RUNS, ids=["second-thread", "exception-filter"])
@pytest.mark.parametrize("build", BUILDS)
def test_k_gives_the_chain_the_program_recorded_every_frame_by_unwind_data(build, run, tmp_path):
    name = "oracle-%s%s" % (build, run)
    chain = recorded_chain(name)
    assert len(chain) == CHAIN_LENGTH[run]
    result = walked(name, tmp_path)
    frames = result.frames[:len(chain) + 1]
    assert [frame.return_address for frame in frames[:-1]] == chain
    assert [frame.ip for frame in frames[1:]] == chain
    assert [frame.found_by for frame in frames] == ["context"] + ["unwind"] * len(chain)
    assert {frame.module for frame in frames} == {"oracle-" + build}


def test_without_the_images_k_says_what_would_give_the_stack(tmp_path):
    result = walked("oracle-clang-O2", tmp_path, with_images=False)
    hint = [problem.message for problem in result.problems if problem.kind == "no_unwind_data"]
    assert len(hint) == 1 and hint[0].startswith("no unwind data for oracle-clang-O2.exe")


def test_the_image_found_in_a_symbol_store_folder_by_timestamp_and_size_unwinds_every_frame(tmp_path):
    # The image only in name.exe/<TimeDateStamp><SizeOfImage>/name.exe, no image path.
    image = PEImage.from_file(os.path.join(WINE, "oracle-mingw-O2.exe"))
    folder = tmp_path / "store" / "oracle-mingw-O2.exe" / ("%08X%x" % (image.timestamp, image.size_of_image))
    folder.mkdir(parents=True)
    shutil.copy(os.path.join(WINE, "oracle-mingw-O2.exe"), str(folder))
    chain = recorded_chain("oracle-mingw-O2")
    result = walked("oracle-mingw-O2", tmp_path, with_images=False, symbols=[str(tmp_path / "store")])
    assert [frame.ip for frame in result.frames[1:len(chain) + 1]] == chain
    assert [frame.found_by for frame in result.frames[1:len(chain) + 1]] == ["unwind"] * len(chain)
