"""Text for a DumpInfoResult, laid out like WinDbg's ``.dumpdebug`` / ``vertarget``."""

from ..layouts.dump_formats import MACHINE_AMD64, MACHINE_I386
from ..render.text import hexaddr

MACHINES = {MACHINE_AMD64: "x64 (AMD64)", MACHINE_I386: "x86"}


def _address(value):
    return hexaddr(value) if value is not None else "-"


def lines(result):
    """The report as a list of lines; tables as (title, headers, rows) tuples."""
    facts = result.facts
    out = []
    size = facts.get("file_size")
    out.append("Dump file:        %s%s" % (facts.get("file", "-"), " (%d bytes)" % size if size is not None else ""))
    kind = facts.get("kind", "?")
    if "dump_type" in facts:
        out.append("Dump type:        %d, %s: %s" % (facts["dump_type"], kind, facts.get("dump_type_description", "")))
    else:
        out.append("Dump type:        %s (%s mode)" % (kind, facts.get("mode", "?")))
    machine = MACHINES.get(facts.get("machine"), facts.get("arch", "?"))
    processors = facts.get("processors")
    out.append("Machine:          %s%s, build %s" % (machine, ", processors: %d" % processors if processors else "",
                                                     facts.get("build") or "unknown"))
    if result.system_time:
        out.append("System time:      %s" % result.system_time)
    bugcheck = facts.get("bugcheck")
    if bugcheck:
        out.append("Bug check:        0x%X (%s)" % (bugcheck[0], ", ".join(_address(p) for p in bugcheck[1:])))
    exception = facts.get("exception")
    if exception:
        out.append("Exception:        0x%08X at %s" % (exception["code"], _address(exception["address"])))
    registers = facts.get("registers") or {}
    pc, sp = ("rip", "rsp") if "rip" in registers else ("eip", "esp")
    if pc in registers:
        out.append("Context:          %s=%s %s=%s" % (pc, _address(registers[pc]), sp, _address(registers.get(sp))))
    if facts.get("current_thread") is not None:
        out.append("Current thread:   %s (ETHREAD)" % _address(facts["current_thread"]))
    if facts.get("minidump_fields"):
        out.append("Header says:      %s" % ", ".join(facts["minidump_fields"]))
    if "physical_pages" in facts:
        out.append("Physical memory:  %d pages (highest PFN 0x%x), page tables at %s"
                   % (facts["physical_pages"], facts.get("highest_pfn", 0), _address(facts.get("directory_table_base"))))
    for name, label in (("ps_loaded_module_list", "PsLoadedModuleList"),
                        ("ps_active_process_head", "PsActiveProcessHead")):
        if facts.get(name) is not None:
            out.append("%s: %s" % (label, _address(facts[name])))
    if facts.get("triage_overflowed"):
        out.append("Overflowed:       the kernel dropped data to fit the small dump (TRIAGE_OPTION_OVERFLOWED)")
    debugger = facts.get("debugger_data")
    if debugger:
        if debugger["present"]:
            out.append("KDDEBUGGER_DATA64 at %s: KernBase %s, PsLoadedModuleList %s, PsActiveProcessHead %s, "
                       "KiProcessorBlock %s" % (_address(debugger["address"]), _address(debugger["kernel_base"]),
                                                _address(debugger["ps_loaded_module_list"]),
                                                _address(debugger["ps_active_process_head"]),
                                                _address(debugger["ki_processor_block"])))
        else:
            out.append("KDDEBUGGER_DATA64: %s" % ("not readable at %s" % _address(debugger["address"])
                                                  if debugger["address"] is not None else "none in this dump"))
    if result.layouts:
        out.append("Structure offsets:")
        for layout in result.layouts:
            out.append("  %-10s from %s" % (layout["type"], layout["source"]))
    parts = facts.get("parts")
    if parts:
        out.append(("Mapped parts (everything else is unreadable):", ["part", "address", "size", "mapped", "file offset"],
                    [[p["what"], _address(p["address"]), "0x%x" % p["size"], "0x%x" % p["mapped"],
                      "0x%x" % p["offset"]] for p in parts]))
    elif facts.get("contents"):
        out.append("Contents:         %s" % "; ".join(facts["contents"]))
    drivers = facts.get("drivers")
    if drivers is not None:
        broken = facts.get("broken_driver")
        out.append(("Drivers (%d)%s:" % (len(drivers), ", the broken one: %s" % broken if broken else ""),
                    ["start", "end", "module", "timestamp", "checksum", "path"],
                    [[_address(d["base"]), _address(d["base"] + d["size"]), d["module"], "%08X" % d["timestamp"],
                      "%X" % d["checksum"], d["name"]] for d in drivers]))
    unloaded = facts.get("unloaded_drivers")
    if unloaded is not None:
        out.append(("Unloaded drivers (%d):" % len(unloaded), ["start", "end", "name"],
                    [[_address(d["start"]), _address(d["end"]), d["name"]] for d in unloaded]))
    blobs = facts.get("secondary_data")
    if blobs:
        out.append(("Secondary data after SizeOfDump (%d DumpBlob records, 0x%x bytes of data):"
                    % (len(blobs), sum(blob["size"] for blob in blobs)), ["tag", "size", "file offset"],
                    [[blob["tag"], "0x%x" % blob["size"], "0x%x" % blob["offset"]] for blob in blobs]))
    mm = facts.get("mm")
    if mm:
        out.append("Mm information:   " + ", ".join("%s 0x%x" % (name, value) for name, value in mm.items()))
    if facts.get("limitation"):
        out.append("Note:             %s" % facts["limitation"])
    for problem in result.problems:
        out.append(str(problem))
    return out
