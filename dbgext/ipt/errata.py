"""Intel PT errata workarounds keyed by the traced CPU (``--cpu FAMILY/MODEL[/STEPPING]``),
with the same CPU-to-erratum table as libipt's ``pt_cpu_errata`` (libipt 2.0.5).

The flow decoder (flow.py) applies each workaround where and as libipt 2.0.5's
instruction flow shows it (checked against libipt with and without the CPU,
tests/test_ipt_differential.py):

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
timing.  The packet listing (``ipt packets``) decodes without errata.
"""

from ..errors import BadInput

# Family 6 model -> errata, as libipt 2.0.5's pt_cpu_errata.
_FAMILY6 = {}
for _models, _errata in [
        ((0x3D, 0x47, 0x4F, 0x56), ("bdm70", "bdm64")),
        ((0x4E, 0x5E, 0x8E, 0x9E, 0xA5, 0xA6), ("bdm70", "skd007", "skd022", "skd010", "skl014", "skl168")),
        ((0x55, 0x6A, 0x6C, 0x8F), ("bdm70", "skd022", "skl014", "skz84")),
        ((0x5C, 0x5F), ("apl12", "apl11")),
        ((0x66, 0x7D, 0x7E, 0x8C, 0x8D, 0xA7, 0xA8), ("bdm70", "skd022", "skl014")),
        ((0x7A, 0x86, 0x96, 0x9C), ("apl11",)),
        ((0x97, 0x9A, 0xBF), ("bdm70", "skd022", "skl014", "apl11"))]:
    for _model in _models:
        _FAMILY6[_model] = frozenset(_errata)


def parse_cpu(text):
    """``FAMILY/MODEL[/STEPPING]`` (decimal, or hex with 0x, as ptxed's --cpu) -> tuple."""
    parts = text.split("/")
    if len(parts) not in (2, 3):
        raise BadInput("--cpu takes FAMILY/MODEL[/STEPPING] (e.g. 6/142/10), got %r" % text)
    try:
        values = tuple(int(part, 0) for part in parts)
    except ValueError:
        raise BadInput("--cpu takes FAMILY/MODEL[/STEPPING] numbers, got %r" % text)
    if not (0 < values[0] <= 0xFFFF and 0 <= values[1] <= 0xFF) or (len(values) == 3 and not 0 <= values[2] <= 0xFF):
        raise BadInput("--cpu %s is out of range (family 1-65535, model and stepping 0-255)" % text)
    return values


def cpu_errata(cpu):
    """The errata libipt knows for ``cpu`` (family, model[, stepping]), as a frozenset of names."""
    if cpu is None or cpu[0] != 6:
        return frozenset()
    return _FAMILY6.get(cpu[1], frozenset())
