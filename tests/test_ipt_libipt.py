"""The libipt back end (dbgext.ipt.libipt, ``ipt flow --decoder libipt``): how it reads
code and how it is loaded.  That it gives the Python decoder's documents, over Intel's
suite and the generated cases, is tests/test_ipt_libipt_agrees.py.

* code comes from target memory through libipt's image callback, read a page at a
  time; code the target cannot read is an error with its trace offset;
* 32-bit code is listed in its mode; ``--resync-on-error`` is refused in one line;
* where the library cannot be loaded, one line says which library and how to get it
  (no library needed: a bogus path); a library of another major version is refused in
  one line; nothing loads libipt at import.
"""

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

import test_ipt_differential as differential
import test_ipt_intel_suite as suite
from dbgext.cli import main
from dbgext.errors import BadInput, UnreadableMemory
from dbgext.ipt import libipt, libipt_api, reconstruct_flow
from dbgext.ipt.flow import CodeImage, decode_flow
from requirements import need_library

REPO = Path(__file__).resolve().parents[1]


def loaded_library():
    """The back end's libipt, or skip the calling test (it is missing)."""
    try:
        library = libipt_api.load()
    except BadInput:
        library = None
    return need_library("libipt", library)


# -- code from target memory (the image callback) -------------------------------------------

class CodeMemory(object):
    """A target whose memory holds ``code`` at ``base`` and nothing else, counting reads."""

    def __init__(self, base, code):
        self.base, self.code = base, code
        self.reads = 0

    def read(self, address, size):
        self.reads += 1
        offset = address - self.base
        if not 0 <= offset < len(self.code):
            raise UnreadableMemory(address)
        if offset + size > len(self.code):
            raise UnreadableMemory(self.base + len(self.code))
        return self.code[offset:offset + size]


@pytest.mark.parametrize("name", ["interrupts_and_psbs", "far_transfer_untraced", "overflow"])
def test_code_read_from_target_memory_through_the_callback_decodes_as_from_images(name):
    for seed in range(3):
        program, trace = differential.compared_case(name, seed)
        memory = CodeMemory(program.base, program.code)
        ours = decode_flow(trace, CodeImage(images=[(program.base, program.code)]))
        theirs = libipt.LibiptFlowDecoder(CodeImage(target=memory), library=loaded_library()).decode(trace)
        assert (seed, theirs.instructions) == (seed, ours.instructions) and ours.instructions
        assert memory.reads < len(ours.instructions)


@pytest.mark.parametrize("base", [0x5000, 0x5010, 0x5FF8])
def test_the_callbacks_reader_serves_code_inside_a_page_across_pages_and_up_to_its_end(base):
    """Pages are read whole where the target can; code that starts inside a page, crosses
    into the next or ends short of what libipt asks for is served as far as it goes."""
    code = bytes(range(1, 0x31))
    reader = libipt._CodeReader(CodeImage(target=CodeMemory(base, code)))
    assert reader.bytes_at(base, 15) == code[:15]
    assert reader.bytes_at(base + 2, 15) == code[2:17]
    assert reader.bytes_at(base + 0x28, 15) == code[0x28:]
    assert reader.bytes_at(base + 0x30, 15) == b"" and reader.bytes_at(base - 1, 15) == b""


def test_code_the_target_cannot_read_is_an_error_with_its_trace_offset():
    name = "tip_pgd-direct_call"
    trace = (suite.SUITE / (name + ".pt")).read_bytes()
    memory = CodeMemory(0x200000, b"\x90")
    result = libipt.LibiptFlowDecoder(CodeImage(target=memory), library=loaded_library()).decode(trace)
    assert result.instructions == []
    assert [(problem.kind, problem.message) for problem in result.problems] == [
        ("ipt_flow_error", "libipt: no memory mapped at this address")]
    assert result.problems[0].offset is not None


# -- the command ----------------------------------------------------------------------------

def test_32_bit_code_is_listed_in_its_mode_with_either_decoder(tmp_path):
    """inc eax, inc ecx, then jmp eax, which a TIP.PGD without IP cannot stop (libipt
    decodes it, then fails it): in 64-bit mode 40 and 41 would be REX prefixes."""
    loaded_library()
    import ipt_support
    base = 0x1000
    image = tmp_path / "code32.bin"
    image.write_bytes(b"\x40\x41\xff\xe0")
    trace = ipt_support.encode([ipt_support.packet("psb"), ipt_support.packet("mode", leaf=0, bits=2),
                                ipt_support.packet("fup", ipc=3, ip=base), ipt_support.packet("psbend"),
                                ipt_support.packet("tip.pgd")])
    listings = {}
    for decoder in ("python", "libipt"):
        result = reconstruct_flow(data=trace, images=[(str(image), base)], decoder=decoder)
        listings[decoder] = [(row["ip"], row["text"]) for row in result.buffers[0].rows]
    assert listings["libipt"] == listings["python"] == [(0x1000, "inc eax"), (0x1001, "inc ecx"),
                                                         (0x1002, "jmp eax")]


def test_resync_on_error_is_refused_with_libipt_in_one_line():
    error = io.StringIO()
    code = main(["ipt", "flow", "--trace", str(suite.SUITE / "tip-eos.pt"), "--image",
                 "%s@1000" % (suite.SUITE / "tip-eos.bin"), "--decoder", "libipt", "--resync-on-error"],
                stream=io.StringIO(), error_stream=error)
    assert code != 0 and error.getvalue().count("\n") == 1 and "needs the python decoder" in error.getvalue()


# -- loading --------------------------------------------------------------------------------

def test_a_library_that_cannot_be_loaded_is_named_in_one_line_with_how_to_get_it(monkeypatch):
    bogus = str(REPO / "no-such-dir" / "libipt.so.2")
    monkeypatch.setenv(libipt_api.LIBRARY_VARIABLE, bogus)
    with pytest.raises(BadInput) as raised:
        reconstruct_flow(data=(suite.SUITE / "tip-eos.pt").read_bytes(),
                         images=[(str(suite.SUITE / "tip-eos.bin"), 0x1000)], decoder="libipt")
    message = str(raised.value)
    assert "\n" not in message and bogus in message and "apt-get install libipt2" in message
    assert "python decoder" in message
    error = io.StringIO()
    code = main(["ipt", "flow", "--trace", str(suite.SUITE / "tip-eos.pt"), "--image",
                 "%s@1000" % (suite.SUITE / "tip-eos.bin"), "--decoder", "libipt"],
                stream=io.StringIO(), error_stream=error)
    assert code != 0 and error.getvalue().count("\n") == 1 and bogus in error.getvalue()


class _OtherMajorVersion(object):
    """Stands for a CDLL of libipt 1.6.1: every entry point accepts its declarations."""

    class _Function(object):
        def __call__(self, *arguments):
            return libipt_api.Version(1, 6, 1, 0, None)

    def __init__(self, name):
        self.name = name

    def __getattr__(self, name):
        function = self._Function()
        setattr(self, name, function)
        return function


def test_a_library_of_another_major_version_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(libipt_api.ctypes, "CDLL", _OtherMajorVersion)
    with pytest.raises(BadInput) as raised:
        libipt_api.load("libipt-1.6.so")
    message = str(raised.value)
    assert "\n" not in message and "libipt-1.6.so is version 1.6.1" in message and "2.x" in message
    assert "libipt-1.6.so" not in libipt_api._loaded


def test_importing_the_ipt_modules_loads_no_libipt():
    """Inside WinDbg the library is usually absent: it is loaded by --decoder libipt only."""
    script = ("import dbgext.ipt, dbgext.ipt.command, dbgext.ipt.libipt\n"
              "print(any('libipt.so' in line for line in open('/proc/self/maps')))")
    output = subprocess.run([sys.executable, "-c", script], cwd=str(REPO), capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=str(REPO)), check=True).stdout
    assert output.strip() == "False"
