"""Which structure layouts an ARM64 target reads with.

- RTL_TRACE_DATABASE and the ETW stack cache's tables are plain 64-bit data:
  an ARM64 target takes the x64 built-in rows (``arm64_as_x64``; assumed, see
  their modules' docstrings).  A database Windows' algorithm built in memory
  walks the same on an ARM64 target as on x64.
- _KTHREAD and _KTRAP_FRAME are not the same on ARM64: their x64 rows are never
  used for offsets.  Offsets come from KDDEBUGGER_DATA64 (on the real ARM64
  small dump), read with the fields' formats of a 64-bit row."""

import pytest

from dbgext.errors import LayoutNotFound
from dbgext.etwcache import layouts as etw_layouts
from dbgext.layouts import BuiltinLayouts, lookup_layout
from dbgext.rtltrace import walk
from dbgext.rtltrace.layouts import DATABASE_TYPE, USER_LAYOUTS
from dbgext.stacks.threads import BUILTIN as THREAD_LAYOUTS
from dbgext.target.base import Target
from dbgext.target.image import ImageBackend

from rtltrace_support import database

TABLE = {"_T": [{"arch": "x64", "size": 0x10, "fields": {"A": (0x8, "Q")}},
                {"arch": "x86", "size": 0x8, "fields": {"A": (0x4, "I")}}]}


def arm64_copy(scenario):
    """The scenario's memory and modules as an ARM64 target with no type information."""
    pages = dict((address, bytes(page)) for address, page in scenario.pages.items())
    return Target(ImageBackend(pages, "arm64", scenario.modules, info={"mode": scenario.mode}))


def test_an_arm64_target_takes_the_x64_row_only_where_the_table_says_so():
    assert BuiltinLayouts(TABLE, arm64_as_x64=True).find("_T", "arm64", None)["size"] == 0x10
    assert BuiltinLayouts(TABLE).find("_T", "arm64", None) is None
    assert USER_LAYOUTS.find(DATABASE_TYPE, "arm64", None) is USER_LAYOUTS.find(DATABASE_TYPE, "x64", None)
    assert etw_layouts.BUILTIN.find("_WMI_LOGGER_CONTEXT", "arm64", 22000)["fields"]["StackCache"] == (0x3E0, "Q")


def test_a_user_trace_database_walks_on_an_arm64_target_as_on_x64():
    scenario, builder = database("user-x64", distinct=60, adds=150)
    target = arm64_copy(scenario)
    db = walk(target, builder.address)
    assert (db.layout.name, db.layout.pointer_size) == ("user-arm64", 8)
    assert db.problems == [] and len(db.blocks) == builder.traces == 60


def test_kthread_offsets_are_never_x64_ones_on_arm64():
    scenario, _ = database("user-x64", distinct=1, adds=1)
    with pytest.raises(LayoutNotFound, match="no layout for nt!_KTHREAD on this arm64 target"):
        lookup_layout(arm64_copy(scenario), "nt!_KTHREAD", THREAD_LAYOUTS)
