"""Text for a DumpInfoResult, laid out like WinDbg's ``.dumpdebug`` / ``vertarget``."""

from ..layouts.dump_formats import MACHINE_AMD64, MACHINE_ARM64, MACHINE_I386
from ..render.text import hexaddr

MACHINES = {MACHINE_AMD64: "x64 (AMD64)", MACHINE_I386: "x86", MACHINE_ARM64: "ARM64"}
# The instruction and stack pointers the Context line shows, by the registers a context has.
CONTEXT_LINE = (("rip", "rsp"), ("pc", "sp"), ("eip", "esp"))


def lines(result):
    """The report as a list of lines; tables as (title, headers, rows) tuples.
    Addresses are printed at the target's pointer width."""
    facts = result.facts
    pointer_size = 4 if facts.get("arch") == "x86" else 8

    def _address(value):
        return hexaddr(value, pointer_size) if value is not None else "-"

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
    if "platform" in facts:
        out.extend(_user_system(facts, machine))
    else:
        out.append("Machine:          %s%s, build %s" % (machine, ", processors: %d" % processors if processors else "",
                                                         facts.get("build") or "unknown"))
    if result.system_time:
        out.append("System time:      %s" % result.system_time)
    bugcheck = facts.get("bugcheck")
    if bugcheck:
        out.append("Bug check:        0x%X (%s)" % (bugcheck[0], ", ".join(_address(p) for p in bugcheck[1:])))
    exception = facts.get("exception")
    if exception:
        out.append("Exception:        0x%08X at %s%s" % (exception["code"], _address(exception["address"]),
                                                          "%s, parameters %s" % (
                                                              " in thread 0x%x" % exception["thread_id"]
                                                              if exception.get("thread_id") is not None else "",
                                                              ", ".join(_address(p) for p in exception["parameters"]))
                                                          if exception.get("parameters") else ""))
    registers = facts.get("registers") or {}
    pc, sp = next((pair for pair in CONTEXT_LINE if pair[0] in registers), CONTEXT_LINE[-1])
    if pc in registers:
        out.append("Context:          %s=%s %s=%s" % (pc, _address(registers[pc]), sp, _address(registers.get(sp))))
    if facts.get("current_thread") is not None:
        out.append("Current thread:   %s (ETHREAD)" % _address(facts["current_thread"]))
    if facts.get("thread_count") is not None:
        out.append("Threads:          %d%s" % (facts["thread_count"], ", current 0x%x" % facts["current_thread_id"]
                                               if facts.get("current_thread_id") is not None else ""))
    if facts.get("memory_ranges") is not None:
        out.append("Memory:           %d ranges, 0x%x bytes captured%s" % (
            facts["memory_ranges"], facts.get("captured_bytes", 0),
            ", %d pages partly captured" % facts["partial_pages"] if facts.get("partial_pages") else ""))
    if facts.get("minidump_fields"):
        out.append("Header says:      %s" % ", ".join(facts["minidump_fields"]))
    if "physical_pages" in facts:
        out.append("Physical memory:  %d pages (highest PFN 0x%x), page tables at %s"
                   % (facts["physical_pages"], facts.get("highest_pfn", 0),
                      _address(facts.get("directory_table_base"))))
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
        out.append(("Mapped parts (everything else is unreadable):",
                    ["part", "address", "size", "mapped", "file offset"],
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
    modules = facts.get("modules")
    if modules is not None:
        out.append(("Modules (%d):" % len(modules), ["start", "end", "module", "timestamp", "checksum", "path"],
                    [[_address(m["base"]), _address(m["base"] + m["size"]), m["name"], "%08X" % (m["timestamp"] or 0),
                      "%X" % (m["checksum"] or 0), m["path"]] for m in modules]))
    unloaded_modules = facts.get("unloaded_modules")
    if unloaded_modules:
        out.append(("Unloaded modules (%d):" % len(unloaded_modules), ["start", "end", "name"],
                    [[_address(m["base"]), _address(m["base"] + m["size"]), m["name"]] for m in unloaded_modules]))
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


def _user_system(facts, machine):
    """The Machine and System lines of a minidump: the CPU, then the platform that
    wrote it (Windows with its version, product type and service pack; macOS,
    Linux... as breakpad and crashpad record them)."""
    cpu = ["family %d" % facts["processor_level"]] if facts.get("processor_level") else []
    revision = facts.get("processor_revision")
    if revision and facts.get("arch") in ("x86", "x64"):
        cpu.append("model 0x%x, stepping %d" % (revision >> 8, revision & 0xFF))
    if facts.get("cpu_vendor"):
        cpu.append(facts["cpu_vendor"])
    processors = facts.get("processors")
    machine_line = "Machine:          %s%s%s" % (machine, ", processors: %d" % processors if processors else "",
                                                " (%s)" % ", ".join(cpu) if cpu else "")
    platform = facts["platform"]
    csd = facts.get("csd_version")
    if platform == "Windows":
        major, minor, build = facts["os_version"].split(".")
        system = "Windows %s.%s build %s%s%s" % (major, minor, build, ", %s" % facts["product_type"]
                                                 if facts.get("product_type") else "", ", %s" % csd if csd else "")
    elif platform in ("macOS", "iOS"):
        system = "%s %s%s" % (platform, facts["os_version"], " (build %s)" % csd if csd else "")
    else:
        system = "%s%s" % (platform, " (%s)" % csd if csd else "")
    return [machine_line, "System:           %s" % system]
