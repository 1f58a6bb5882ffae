"""Intel PT errata workarounds keyed by the traced CPU (``--cpu FAMILY/MODEL[/STEPPING]``),
with the same CPU-to-erratum table as libipt's ``pt_cpu_errata`` (libipt 2.0.5).

The flow decoder applies the workarounds that change the instruction flow:

* APL11 (and SKD010's overflow handling): a TIP.PGD right after an OVF is an
  artefact of the overflow and is ignored; without the erratum it is an error,
  as in libipt;
* SKD022: FUP + TIP.PGD at a VMLAUNCH/VMRESUME is the VM entry clearing TraceEn:
  the instruction ran and tracing stopped after it (libipt turns the asynchronous
  disable into a synchronous one).

The others are listed so ``--cpu`` names them, but decoding does not depend on them
(BDM70, BDM64, SKD007, SKL014, APL12, SKL168, SKZ84).
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
