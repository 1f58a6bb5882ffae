"""Intel's own libipt test suite is the specification of the packet decoder and the
flow: every ``.ptt`` in ``../shared/realworld/ipt/libipt-ptt/`` (230 tests, current
upstream), decoded the way its expected listings were made.  Every test agrees.

* packets: ``decode_packets`` of ``NAME.pt``, from the first PSB, with the errata of
  each CPU ptdump runs the test with (its ``--cpu``, else each ``; cpu`` line), equals
  ``NAME-ptdump.exp`` line for line: offset, packet name, and the payload column
  ptdump prints (IP bytes and IP, TNT bits, payload fields);
* flows: ``decode_flow`` of ``NAME.pt`` over ``NAME.bin`` at the ``.ptt``'s ``org``,
  with each of the test's CPUs (its errata workarounds on), equals the instruction
  addresses of ``NAME-ptxed.exp`` up to its end (``[end of trace]``, or the first
  error when the test does not resynchronise), and its events (PTXED_EVENTS: the
  kinds both print) come in ptxed's order.

A ptxed option changes nothing to compare (event and timing display) or has an
equivalent (``--resync-on-error``: FlowDecoder's ``resync_on_error``;
``--event:iflags``: its ``report_iflags``; ``--cpu``), or its test is not
applicable, for a reason listed in FLOW_NOT_APPLICABLE (a short list: a test
asserts it stays so).
"""

import re
from pathlib import Path

import pytest

from dbgext.ipt.errata import cpu_errata, parse_cpu
from dbgext.ipt.flow import CodeImage, decode_flow
from dbgext.ipt.packets import PSB, decode_packets

SUITE = Path(__file__).resolve().parents[1].parent / "shared" / "realworld" / "ipt" / "libipt-ptt"
TESTS = sorted(path.stem for path in SUITE.glob("*.ptt"))
FLOW_TESTS = [name for name in TESTS if (SUITE / (name + "-ptxed.exp")).exists()]

# ptxed options whose test cannot be compared, with the reason (short: a test below
# asserts it does not grow).
FLOW_NOT_APPLICABLE = {
    "--block:show-blocks": "prints the block decoder's blocks, which dbgext does not list",
    "--filter:addr0_cfg": "decodes under an IP filter configuration, which dbgext is not given",
    "--quiet": "lists no instructions",
    "--raw": "loads the code from an offset of another file",
}
NOT_APPLICABLE_LIMIT = 4

# ptdump's name of each packet type.
PTDUMP_NAMES = {"tnt8": "tnt.8", "tnt64": "tnt.64", "invalid": "<invalid>"}
PTDUMP_TYPES = {"pad", "psb", "psbend", "ovf", "stop", "tnt.8", "tnt.64", "tip", "tip.pge", "tip.pgd", "fup",
                "mode.exec", "mode.tsx", "pip", "tsc", "cbr", "tma", "mtc", "cyc", "vmcs", "mnt", "exstop",
                "mwait", "pwre", "pwrx", "ptw", "cfe", "evd", "trig", "<invalid>"}
# IPBytes -> (payload hex digits shown, '?' digits before them)
IP_SHOWN = {0: (0, 16), 1: (4, 12), 2: (8, 8), 3: (16, 0), 4: (12, 4), 6: (16, 0)}
CFE_WITH_VECTOR = {1, 5, 9, 12, 14}  # INTR, SIPI, VMEXIT_INTR, UINTR, SWINTR
CFE_SIPI = 5  # its vector is shown in hex, the others' in decimal


def directives(name):
    """{"cpus": ["F/M"...], "ptxed": [options], "ptdump": [options], "org": int}."""
    found = {"cpus": [], "ptxed": [], "ptdump": [], "org": 0}
    for line in (SUITE / (name + ".ptt")).read_text().splitlines():
        words = line.lstrip("; ").split()
        if line.startswith(";") and len(words) >= 2 and words[0] == "cpu":
            found["cpus"].append(words[1])
        elif line.startswith(";") and words and words[0] in ("opt:ptxed", "opt:ptdump"):
            found[words[0][4:]] += words[1:]
        elif words[:1] == ["org"]:
            found["org"] = int(words[1], 0)
    return found


def ptdump_payload(packet):
    """The payload column ptdump prints for ``packet`` (a dbgext Packet)."""
    fields, kind = packet.fields, packet.type
    if kind in ("tnt8", "tnt64"):
        return fields["bits"].replace("T", "!").replace("N", ".")
    if kind in ("tip", "tip.pge", "tip.pgd", "fup"):
        shown, hidden = IP_SHOWN[fields["ipbytes"]]
        ip = fields["ip"] or 0
        digits = ("%016x" % ip)[16 - shown:] if shown else ""
        return "%d: %s%s" % (fields["ipbytes"], "?" * hidden, digits)
    if kind == "mode.exec":
        return ", ".join(flag for flag, on in (("cs.l", fields["csl"]), ("cs.d", fields["csd"]),
                                                ("if", fields["if"])) if on)
    if kind == "mode.tsx":
        return ", ".join(flag for flag, on in (("intx", fields["intx"]), ("abrt", fields["abort"])) if on)
    if kind == "pip":
        return "%x%s" % (fields["cr3"], ", nr" if fields["nr"] else "")
    if kind in ("tsc", "cbr", "mtc", "cyc", "vmcs", "mnt"):
        return "%x" % fields[{"tsc": "tsc", "cbr": "ratio", "mtc": "ctc", "cyc": "value", "vmcs": "base",
                              "mnt": "payload"}[kind]]
    if kind == "tma":
        return "%x, %x" % (fields["ctc"], fields["fc"])
    if kind == "exstop":
        return "ip" if fields["ip"] else ""
    if kind == "mwait":
        return "%08x, %08x" % (fields["hints"], fields["ext"])
    # ptdump names a C-state by its encoding plus one (0 is C1, 0xF is C0).
    if kind == "pwre":
        return "c%x.%x%s" % ((fields["state"] + 1) & 0xF, (fields["sub_state"] + 1) & 0xF,
                             ", hw" if fields["hw"] else "")
    if kind == "pwrx":
        wake = "int" if fields["interrupt"] else "st" if fields["store"] else "hw" if fields["autonomous"] else ""
        return "%s: c%x, c%x" % (wake, (fields["last"] + 1) & 0xF, (fields["deepest"] + 1) & 0xF)
    if kind == "ptw":
        return "%d: %x%s" % (fields["size"] // 8, fields["payload"], ", ip" if fields["ip"] else "")
    if kind == "cfe":
        shown = "%d" % fields["cfe_type"]
        if fields["cfe_type"] in CFE_WITH_VECTOR:
            shown += (": %x" if fields["cfe_type"] == CFE_SIPI else ": %d") % fields["vector"]
        return shown + (", ip" if fields["ip"] else "")
    if kind == "evd":
        return "%d: %x" % (fields["evd_type"], fields["payload"])
    if kind == "trig":
        return "%02x%s%s%s" % (fields["trbv"], ", ip" if fields["ip"] else "", ", mult" if fields["mult"] else "",
                               ", icnt: %d" % fields["icnt"] if fields["icnt"] is not None else "")
    return ""


# A ptdump line: [offset] [raw bytes] name, then columns two or more spaces apart:
# the payload, then what options add (timing, the last IP, the execution mode...).
_PTDUMP_LINE = re.compile(r"^(?:([0-9a-f]{16})\s+)?(?:[0-9a-f]+\s+)?(%s)(?:\s+(.*))?$"
                          % "|".join(re.escape(name) for name in sorted(PTDUMP_TYPES, key=len, reverse=True)))
_EXTRA_COLUMN = re.compile(r"^(?:tsc|fcr|cr3|vmcs|type|ip|em) ")


def expected_packets(name, with_offsets):
    """ptdump's (offset or None, name, payload) lines, from the first PSB on."""
    rows = []
    for line in (SUITE / (name + "-ptdump.exp")).read_text().splitlines():
        match = _PTDUMP_LINE.match(line.strip())
        if not match:
            continue
        payload = re.split(r"\s{2,}", match.group(3) or "")[0]
        if _EXTRA_COLUMN.match(payload):
            payload = ""
        offset = int(match.group(1), 16) if with_offsets and match.group(1) else None
        rows.append((offset, match.group(2), payload))
    first = next((index for index, row in enumerate(rows) if row[1] == "psb"), len(rows))
    return rows[first:]


def our_packets(name, with_offsets, cpu=None):
    """decode_packets' listing as ptdump's lines, with the errata of ``cpu`` (the packet
    layer's: SKD007, SKZ84) as ptdump run with that CPU."""
    data = (SUITE / (name + ".pt")).read_bytes()
    hidden = {"cyc"} if "--no-cyc" in directives(name)["ptdump"] else set()
    return [(packet.offset if with_offsets else None, PTDUMP_NAMES.get(packet.type, packet.type),
             ptdump_payload(packet)) for packet in decode_packets(data, errata=errata_of(cpu)).packets
            if packet.type not in hidden]


_ADDRESS = re.compile(r"^(?:\? )?([0-9a-f]{16})\b")


def expected_flow(name):
    """ptxed's instruction addresses up to its end: the end of trace, or the first
    error when the test does not resynchronise (ptxed stops there)."""
    resync = "--resync-on-error" in directives(name)["ptxed"]
    addresses = []
    for line in (SUITE / (name + "-ptxed.exp")).read_text().splitlines():
        match = _ADDRESS.match(line)
        if match:
            addresses.append(int(match.group(1), 16))
        elif line.startswith("[end of trace]") or (": error:" in line and not resync):
            break
    return addresses


def not_applicable(name):
    """The reason the flow of test ``name`` cannot be compared, or None."""
    for option in directives(name)["ptxed"]:
        for prefix, reason in FLOW_NOT_APPLICABLE.items():
            if option.startswith(prefix):
                return reason
    return None


def cpus(name, tool="ptxed"):
    """The CPUs ``tool`` (ptxed, ptdump) runs the test with: its ``--cpu`` option, else each
    ``; cpu`` line (the suite runs the tool once per line, against the same listing), [None] for none."""
    found = directives(name)
    options = found[tool]
    if "--cpu" in options:
        return [options[options.index("--cpu") + 1]]
    return found["cpus"] or [None]


def errata_of(cpu):
    """The errata workarounds a tool applies for ``cpu`` ("F/M"; "0/0" and None: no CPU)."""
    return cpu_errata(parse_cpu(cpu)) if cpu and cpu != "0/0" else frozenset()


def decoded(name, cpu):
    """decode_flow of the test with ``cpu``'s errata and the equivalent of each ptxed option."""
    found = directives(name)
    code = CodeImage(images=[(found["org"], (SUITE / (name + ".bin")).read_bytes())])
    return decode_flow((SUITE / (name + ".pt")).read_bytes(), code, errata=errata_of(cpu),
                       resync_on_error="--resync-on-error" in found["ptxed"],
                       report_iflags="--event:iflags" in found["ptxed"])


def our_flow(name, cpu):
    return decoded(name, cpu).instructions


def test_the_suite_is_there_whole():
    assert len(TESTS) == 230 and len(FLOW_TESTS) == 191
    for name in TESTS:
        assert (SUITE / (name + ".pt")).read_bytes().find(PSB) >= 0 or name.startswith("ptdump-"), name


@pytest.mark.parametrize("name", TESTS)
def test_packets_equal_ptdumps_listing_with_each_of_the_tests_cpus(name):
    with_offsets = "--no-offset" not in directives(name)["ptdump"]
    for cpu in cpus(name, "ptdump"):
        assert (cpu, our_packets(name, with_offsets, cpu)) == (cpu, expected_packets(name, with_offsets))


def test_the_packet_layer_errata_change_the_listing_only_with_their_cpu():
    """skd007 and skz84 list the packets as encoded without a CPU, and as ptdump with theirs."""
    for name, cpu, listed in [("skd007", "6/78", (0x19, "ovf", "")), ("skz84", "6/85", (0x1b, "<invalid>", ""))]:
        assert listed in our_packets(name, True, cpu) and listed not in our_packets(name, True)
        assert our_packets(name, True) != expected_packets(name, True)


@pytest.mark.parametrize("name", [name for name in FLOW_TESTS if not_applicable(name) is None])
def test_flow_equals_ptxeds_instructions_with_each_of_the_tests_cpus(name):
    for cpu in cpus(name):
        assert (cpu, our_flow(name, cpu)) == (cpu, expected_flow(name))


def test_the_list_of_options_without_an_equivalent_stays_short():
    assert len(FLOW_NOT_APPLICABLE) <= NOT_APPLICABLE_LIMIT
    assert all(any(not_applicable(name) == reason for name in FLOW_TESTS) for reason in FLOW_NOT_APPLICABLE.values())


def test_resync_on_error_goes_on_at_the_next_ip_from_the_command_line():
    """ptxed-resync-bad_query-tip: the jnz finds a TIP (listed: libipt had decoded it); with
    --resync-on-error decoding goes on at that TIP's IP, without it at the next PSB (there is none)."""
    import io
    import json

    from dbgext.cli import main
    name = "ptxed-resync-bad_query-tip"
    argv = ["ipt", "flow", "--trace", str(SUITE / (name + ".pt")), "--image",
            "%s@%x" % (SUITE / (name + ".bin"), directives(name)["org"]), "--json"]
    listed = {}
    for option in ([], ["--resync-on-error"]):
        stream = io.StringIO()
        main(argv + option, stream=stream)
        document = json.loads(stream.getvalue())
        listed[bool(option)] = [row["ip"] for row in document["buffers"][0]["instructions"]]
        assert [problem["kind"] for problem in document["problems"]] == ["ipt_flow_error"]
    assert listed == {False: [0x100000], True: [0x100000, 0x100005]}


def test_packets_with_the_tests_cpu_from_the_command_line():
    """skz84 with ``ipt packets --cpu 6/85``: the corrupted TMA and the byte after it are one
    invalid packet, as ptdump lists them; without the CPU the TMA does not decode."""
    import io
    import json

    from dbgext.cli import main
    argv = ["ipt", "packets", "--trace", str(SUITE / "skz84.pt")]
    listed = {}
    for cpu in ([], ["--cpu", "6/85"]):
        stream = io.StringIO()
        main(argv + cpu + ["--json"], stream=stream)
        document = json.loads(stream.getvalue())
        listed[bool(cpu)] = ([(row["offset"], row["type"]) for row in document["buffers"][0]["packets"]][3:5],
                             document["cpu"], document["errata"])
    assert listed[False] == ([(0x19, "psbend")], None, [])
    assert listed[True] == ([(0x19, "psbend"), (0x1b, "invalid")], [6, 85], ["bdm70", "skd022", "skl014", "skz84"])
    stream = io.StringIO()
    main(argv + ["--cpu", "6/85"], stream=stream)
    assert re.search(r"0x1b +invalid +erratum", stream.getvalue())



def test_event_iflags_from_the_command_line_and_refused_with_libipt_in_one_line():
    import io
    import json

    from dbgext.cli import main
    name = "ptet-mode_exec-if"
    argv = ["ipt", "flow", "--trace", str(SUITE / (name + ".pt")), "--image",
            "%s@%x" % (SUITE / (name + ".bin"), directives(name)["org"]), "--event-iflags"]
    stream = io.StringIO()
    assert main(argv + ["--json"], stream=stream) == 0
    kinds = [event["kind"] for event in json.loads(stream.getvalue())["buffers"][0]["events"]]
    assert kinds == ["enabled", "interrupts_disabled", "interrupts_enabled", "interrupts_disabled", "disabled"]
    error = io.StringIO()
    assert main(argv + ["--decoder", "libipt"], stream=io.StringIO(), error_stream=error) == 1
    assert error.getvalue().count("\n") == 1 and "report_iflags needs the python decoder" in error.getvalue()


# -- events ---------------------------------------------------------------------------

# The events both print, by the start of ptxed's line: compared as a sequence of kinds.
# ptxed prints an enabled event as "[resumed]" when tracing goes on at the IP where it
# was disabled (libipt's resumed flag); the flow calls both "enabled".
PTXED_EVENTS = (("[enabled", "enabled"), ("[resumed", "enabled"), ("[disabled", "disabled"),
                ("[overflow", "overflow"), ("[interrupts enabled", "interrupts_enabled"),
                ("[interrupts disabled", "interrupts_disabled"),
                ("[interrupt", "interrupt"), ("[exstop", "exstop"), ("[ptwrite", "ptwrite"),
                ("[begin transaction", "tsx_begin"), ("[committed", "tsx_commit"), ("[aborted", "tsx_abort"),
                ("[paging", "paging"))


# With --event:time ptxed starts an event line with the event's time stamp.
_EVENT_TIME = re.compile(r"^\[[0-9a-f]{16}  ")
# The event trace's interrupt (a CFE of type INTR) names its vector; ptxed's "[interrupt]"
# alone is the asynchronous transfer.
_EVENT_INTERRUPT = re.compile(r"^\[interrupt [0-9]")


def expected_events(name):
    """The kinds of ptxed's event lines of PTXED_EVENTS, up to where expected_flow stops."""
    resync = "--resync-on-error" in directives(name)["ptxed"]
    kinds = []
    for line in (SUITE / (name + "-ptxed.exp")).read_text().splitlines():
        if line.startswith("[end of trace]") or (": error:" in line and not resync):
            break
        line = _EVENT_TIME.sub("[", line)
        if _EVENT_INTERRUPT.match(line):
            kinds.append("event_interrupt")
            continue
        kinds += [kind for prefix, kind in PTXED_EVENTS if line.startswith(prefix)][:1]
    return kinds


def our_events(name):
    result = decoded(name, cpus(name)[0])
    wanted = {kind for _, kind in PTXED_EVENTS} | {"event_interrupt"}
    return [event[1] for event in result.events if event[1] in wanted]


@pytest.mark.parametrize("name", [name for name in FLOW_TESTS if not_applicable(name) is None])
def test_flow_events_equal_ptxeds_events(name):
    assert our_events(name) == expected_events(name)


def test_the_interrupt_flag_tracing_is_enabled_with_is_an_event_with_ptxeds_option_only():
    """ptet-mode_exec-if (ptxed's --event:iflags): no MODE.Exec came before the one the
    TIP.PGE enables tracing with, whose IF bit is clear."""
    enabled_with = ["enabled", "interrupts_disabled", "interrupts_enabled", "interrupts_disabled", "disabled"]
    assert our_events("ptet-mode_exec-if") == expected_events("ptet-mode_exec-if") == enabled_with
    found = directives("ptet-mode_exec-if")
    code = CodeImage(images=[(found["org"], (SUITE / "ptet-mode_exec-if.bin").read_bytes())])
    default = decode_flow((SUITE / "ptet-mode_exec-if.pt").read_bytes(), code)
    assert [event[1] for event in default.events] == enabled_with[:1] + enabled_with[2:]
