"""Run ``commands/<name>.py`` exactly as WinDbg's ``!py`` does, over a fake pykd.

    text, fake = run_windbg_script("db", ["nt!KiSystemStartup", "L20"], scenario)

What WinDbg (pykd-ext bootstrapper) gives a script, reproduced here: a fresh
``__main__`` namespace with no ``__file__``, ``sys.argv = [full path, args...]``,
recursion limit 500, a ``sys.stdout`` that only takes ``str`` (``write``,
``writedml``, ``flush``, ``isatty``, ``encoding == "ascii"``, no ``.buffer``), and
``import pykd`` giving the debugger's module — here the fake.
"""

import os
import sys

from fake_pykd import make_fake_pykd

COMMANDS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "commands")


class DebuggerOutput(object):
    """WinDbg's stdout object.  ``chunks`` keeps (kind, text) in order; ``text``
    is everything written, DML included as markup."""

    encoding = "ascii"
    closed = False

    def __init__(self):
        self.chunks = []

    def write(self, text):
        if not isinstance(text, str):
            raise TypeError("write() argument must be str, not %s" % type(text).__name__)
        self.chunks.append(("text", text))

    def writedml(self, text):
        if not isinstance(text, str):
            raise TypeError("writedml() argument must be str, not %s" % type(text).__name__)
        self.chunks.append(("dml", text))

    def flush(self):
        pass

    def isatty(self):
        return False

    @property
    def text(self):
        return "".join(text for _, text in self.chunks)


def run_windbg_script(name, args, target_or_scenario, **fake_options):
    """Run ``commands/<name>.py`` (or ``name`` itself when it is a path ending in
    ``.py``) with ``args`` over a fake pykd backed by a Scenario, a Target or a
    dump path; returns (output text, the fake module).

    ``fake_options`` go to :func:`make_fake_pykd` (mode, dump, registers...).
    An exception escaping the script propagates (WinDbg would print its traceback;
    a test should see it)."""
    fake = make_fake_pykd(target_or_scenario, **fake_options)
    path = name if name.endswith(".py") else os.path.join(COMMANDS_DIR, name + ".py")
    with open(path, "r") as handle:
        source = handle.read()
    output = DebuggerOutput()
    saved = (sys.argv, sys.stdout, sys.stderr, sys.getrecursionlimit(), sys.modules.get("pykd"), list(sys.path))
    sys.argv = [path] + [str(arg) for arg in args]
    sys.stdout = sys.stderr = output
    sys.modules["pykd"] = fake
    sys.setrecursionlimit(500)
    try:
        exec(compile(source, path, "exec"), {"__name__": "__main__"})
    finally:
        sys.argv, sys.stdout, sys.stderr, limit, previous_pykd, sys.path[:] = saved
        sys.setrecursionlimit(limit)
        if previous_pykd is None:
            sys.modules.pop("pykd", None)
        else:
            sys.modules["pykd"] = previous_pykd
    return output.text, fake


# DbgEng round trips behind each pykd memory call (pykd-api.md section 9): a block
# read is GetValidRegionVirtual + ReadVirtual, a scalar read one ReadVirtual plus two
# GetActualProcessorType (addr64), a validity query one call.
ENGINE_CALLS_PER_MEMORY_CALL = {"loadBytes": 2, "loadWords": 2, "loadDWords": 2, "loadQWords": 2, "loadPtrs": 2,
                                "ptrByte": 3, "ptrWord": 3, "ptrDWord": 3, "ptrQWord": 3, "ptrPtr": 3,
                                "ptrMWord": 3, "isValid": 1, "isVaRegionValid": 1}


def memory_engine_calls(fake):
    """The engine round trips the memory calls counted by ``fake`` stand for."""
    return sum(fake.fake_calls[name] * cost for name, cost in ENGINE_CALLS_PER_MEMORY_CALL.items())


# -- a small kernel scenario shared by the pykd and basic-command tests --------------

NT_BASE = 0xFFFFF80000000000
DRIVER_BASE = 0xFFFFF80012340000


class Layout(object):
    """Where :func:`kernel_scenario` put things."""


def kernel_scenario():
    """nt and a driver with symbols and ISF types, a page of data followed by an
    unmapped page, a 3-entry LIST_ENTRY list of _WIDGETs, strings, one thread."""
    from dbgext.sample.scenario import Scenario, Thread
    s = Scenario("x64", "kernel", build=19045)
    at = Layout()
    s.add_module("nt", NT_BASE, 0x20000, image="ntoskrnl.exe")
    s.add_module("mydrv", DRIVER_BASE, 0x3000, image="mydrv.sys")
    s.add_symbol("nt", "KiSystemStartup", 0x1000)
    s.add_symbol("nt", "KeBugCheckEx", 0x2000)
    s.add_symbol("mydrv", "DriverEntry", 0x1100)
    s.add_type("nt", "_LIST_ENTRY", 0x10, {"Flink": 0, "Blink": 8})
    s.add_type("nt", "_WIDGET", 0x28, {"Size": 0x0, "Links": (0x8, "_LIST_ENTRY"), "Tag": 0x18})
    widget = s.module_symbols["nt"].types["_WIDGET"]["fields"]
    widget["Self"] = {"offset": 0x20, "type": {"kind": "pointer", "subtype": {"kind": "struct", "name": "_WIDGET"}}}
    widget["Size"]["type"] = {"kind": "base", "name": "unsigned long"}
    at.page = s.alloc_pages(0x1000)          # readable page; the page after it is unmapped
    at.hole = at.page + 0x1000
    s.write(at.page, bytes(range(256)) * 16)
    at.text = s.alloc(0x40)
    s.write(at.text, b"Hello, WinDbg\0")
    at.wide = s.alloc(0x40)
    s.write(at.wide, "Wide\0".encode("utf-16-le"))
    at.unicode_string = s.alloc(0x10)
    s.pack(at.unicode_string, "<HHxxxxQ", 8, 10, at.wide)
    at.head = s.alloc(0x10)
    at.widgets = [s.alloc(0x28) for _ in range(3)]
    chain = [at.head] + [w + 8 for w in at.widgets]
    for index, node in enumerate(chain):
        s.pack(node, "<QQ", chain[(index + 1) % len(chain)], chain[index - 1])
    for number, address in enumerate(at.widgets):
        s.pack(address, "<I", 0x100 * (number + 1))
        s.pack(address + 0x18, "<Q", 0x74656757 + number)
        s.pack(address + 0x20, "<Q", address)
    at.pointers = s.alloc(0x20)
    s.pack(at.pointers, "<QQQQ", NT_BASE + 0x1010, 0x1234, DRIVER_BASE + 0x1100, NT_BASE + 0x10)
    at.kthread = s.alloc(0x400)
    s.registers = {"rip": NT_BASE + 0x2010, "rsp": 0xFFFFD00000010000, "rbp": 0xFFFFD00000010100, "rax": 7}
    s.threads.append(Thread(4, kthread=at.kthread))
    s.bugcheck = (0xD1, 0x10, 2, 0, NT_BASE + 0x2010)
    return s, at
