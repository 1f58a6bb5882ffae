"""Intel PT errata workarounds keyed by the traced CPU (``--cpu FAMILY/MODEL[/STEPPING]``),
with the same CPU-to-erratum table as upstream libipt's ``pt_cpu_errata``.

The flow decoder (flow.py) applies each workaround where and as libipt 2.0.5's
instruction flow shows it (checked against libipt with and without the CPU,
tests/test_ipt_differential.py); the two of the packet layer (SKD007, SKZ84) are
packets.packet_errata, which the packet listing applies too:

* BDM70 (query layer): a PSB+ while tracing is off holds a FUP (and MODE.Exec) right
  before a TIP.PGE: the FUP is ignored, IP and all (the TIP.PGE's IP builds on no
  earlier IP); without the erratum it is an error;
* BDM64 (instruction layer): a transaction abort right after a branch whose IP cannot
  be reached from that branch's destination along straight-line code (0x100
  instructions): the branch went to the abort IP;
* SKD007 (packet layer): an OVF after the first byte of a multi-byte CYC: a 2-byte CYC
  whose second byte starts an OVF (02 F3) is that first byte, and the OVF counts;
* SKD010 (query layer): an OVF without its FUP: tracing resumes after a TIP.PGD, at a
  TIP, at a FUP or at a PSB+ FUP that follows;
* SKD022 (instruction layer): FUP + TIP.PGD at a VMLAUNCH/VMRESUME is the VM entry
  clearing TraceEn: the instruction ran and tracing stopped after it;
* APL11 (query layer, with SKD010's overflow handling): a TIP.PGD right after an OVF
  is an artefact of the overflow and is ignored; without the erratum it is an error;
* APL12 (query layer): an OVF, then a FUP although tracing was off (a TIP.PGE or a PSB+
  without FUP follows): the FUP is skipped;
* SKZ84 (packet layer): a TMA with reserved bits set and the bogus byte after it are
  skipped; without the erratum the TMA is an error.

Two change nothing here, as in libipt's instruction flow: SKL014 (a TIP.PGD without
its IP after a direct branch) applies only with an address-filter configuration,
which libipt is not given by default and the flow has none of; SKL168 (a CYC/MTC
dropped before a PSB) only corrects time calibration, and the flow reconstructs no
timing.  The packet listing (``ipt packets --cpu``) shows the packets SKD007 and SKZ84
hit as libipt's packet decoder and ptdump do: one OVF, one invalid packet.
"""

from ..errors import BadInput

# (family, model) -> errata, as upstream libipt's pt_cpu_errata: the CPUs Intel's test
# suite runs each erratum's tests with (2.0.5 knows the first rows' models only; upstream
# no longer lists SKL014 for 6/0x8F, 6/0x97, 6/0x9A and 6/0xBF).
_ERRATA = {}
for _cpus, _errata in [
        (((6, 0x3D), (6, 0x47), (6, 0x4F), (6, 0x56)), ("bdm70", "bdm64")),
        (((6, 0x4E), (6, 0x5E), (6, 0x8E), (6, 0x9E), (6, 0xA5), (6, 0xA6)),
         ("bdm70", "skd007", "skd022", "skd010", "skl014", "skl168")),
        (((6, 0x55), (6, 0x6A), (6, 0x6C)), ("bdm70", "skd022", "skl014", "skz84")),
        (((6, 0x5C), (6, 0x5F)), ("apl12", "apl11")),
        (((6, 0x66), (6, 0x7D), (6, 0x7E), (6, 0x8C), (6, 0x8D), (6, 0xA7), (6, 0xA8)), ("bdm70", "skd022", "skl014")),
        (((6, 0x7A), (6, 0x86), (6, 0x96), (6, 0x9C), (6, 0xAF), (6, 0xB6), (6, 0xDD)), ("apl11",)),
        (((6, 0x8F), (6, 0xAD), (6, 0xAE), (6, 0xCF), (19, 0x01)), ("bdm70", "skd022", "skz84")),
        (((6, 0x97), (6, 0x9A), (6, 0xAA), (6, 0xAC), (6, 0xB5), (6, 0xB7), (6, 0xBA), (6, 0xBD), (6, 0xBF),
          (6, 0xC5), (6, 0xC6), (6, 0xCC), (6, 0xD5), (18, 0x01), (18, 0x03)), ("bdm70", "skd022", "apl11"))]:
    for _cpu in _cpus:
        _ERRATA[_cpu] = frozenset(_errata)


def parse_cpu(text):
    """``FAMILY/MODEL[/STEPPING]`` (decimal, or hex with 0x, as ptxed's --cpu) -> tuple."""
    parts = text.split("/")
    if len(parts) not in (2, 3):
        raise BadInput("a CPU is FAMILY/MODEL[/STEPPING] (e.g. 6/142/10), got %r" % text)
    try:
        values = tuple(int(part, 0) for part in parts)
    except ValueError:
        raise BadInput("a CPU is FAMILY/MODEL[/STEPPING] in numbers, got %r" % text)
    if not (0 < values[0] <= 0xFFFF and 0 <= values[1] <= 0xFF) or (len(values) == 3 and not 0 <= values[2] <= 0xFF):
        raise BadInput("CPU %s is out of range (family 1-65535, model and stepping 0-255)" % text)
    return values


def cpu_errata(cpu):
    """The errata libipt knows for ``cpu`` (family, model[, stepping]), as a frozenset of names."""
    if cpu is None:
        return frozenset()
    return _ERRATA.get(tuple(cpu[:2]), frozenset())
