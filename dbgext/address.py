"""WinDbg-style address expressions and ranges, for every command's arguments.

Numbers are hexadecimal by default (``1000``, ``0x1000``, ``fffff800`00001000``),
``0n`` marks decimal; ``module!symbol`` and bare ``module`` (its base) resolve
through the target's symbols; terms combine with ``+`` and ``-``:
``nt!KiSystemStartup+10``; ``module+off`` is the module's base plus ``off``;
``@rsp`` is a register of the selected thread, ``@$ip`` a pseudo-register
(dbgext.pseudo_registers resolves them for every command).  A range after the start address is
``L<count>`` (units, hex) or an inclusive end address, as WinDbg's ``d*`` commands
take.  Every error names the token that failed.
"""

import re

from .errors import BadInput, SymbolNotFound

_HEX = re.compile(r"^(0x)?[0-9a-f]+$", re.IGNORECASE)
_DECIMAL = re.compile(r"^0n[0-9]+$", re.IGNORECASE)
_NAME = re.compile(r"^[A-Za-z_$?][\w$@?.:<>]*(![\w$@?.:<>~]+)?$")
_REGISTER = re.compile(r"^@[A-Za-z][A-Za-z0-9]*$")
_PSEUDO_REGISTER = re.compile(r"^@\$[A-Za-z][A-Za-z0-9]*$")
_LENGTH = re.compile(r"^[Ll](\?)?\s*(.+)$")

ADDRESS_LIMIT = 1 << 64


def parse_number(text):
    """A number without a target: hex by default (``0x`` optional, backticks
    allowed: ``fffff800`00001000``), ``0n`` for decimal, an optional ``L`` prefix
    for counts.  For options that need no symbols (file offsets, sizes)."""
    cleaned = text.strip().replace("`", "")
    if cleaned[:1] in ("L", "l") and len(cleaned) > 1:
        cleaned = cleaned[1:]
    if _DECIMAL.match(cleaned):
        return int(cleaned[2:], 10)
    if not _HEX.match(cleaned):
        raise BadInput("'%s' is not a number (hex by default, 0n for decimal)" % text)
    return int(cleaned, 16)


class TargetResolver(object):
    """What :func:`evaluate` needs from a Target: symbol and module-name lookups."""

    def __init__(self, target):
        self._target = target

    def address(self, name):
        return self._target.symbol_address(name)

    def module_base(self, name):
        module = self._target.module_named(name)
        return module.base if module else None

    def register(self, name):
        return self._target.register(name)

    def pseudo_register(self, name):
        """``@$name``: dbgext.pseudo_registers.PseudoRegisterResolver knows them."""
        raise BadInput("@$%s: pseudo-registers are not resolved here" % name)


def evaluate(text, resolver):
    """The integer an expression stands for; BadInput / SymbolNotFound otherwise."""
    expression = "".join(text.split())
    if not expression:
        raise BadInput("empty address expression")
    terms = re.split(r"([+-])", expression)
    total = 0
    sign = 1
    expect_term = True
    for piece in terms:
        if piece == "":
            continue
        if piece in ("+", "-"):
            if piece == "-":
                sign = -sign
            expect_term = True
            continue
        total += sign * _term(piece, text, resolver)
        sign = 1
        expect_term = False
    if expect_term:
        raise BadInput("'%s' ends in an operator (in '%s')" % (terms[-2] if len(terms) > 1 else text, text))
    if not 0 <= total < ADDRESS_LIMIT:
        raise BadInput("address expression '%s' is out of range" % text)
    return total


def _term(piece, text, resolver):
    number = piece.replace("`", "")
    if _DECIMAL.match(number):
        return int(number[2:], 10)
    if _HEX.match(number):
        return int(number, 16)
    if _REGISTER.match(piece):
        return resolver.register(piece[1:].lower())
    if _PSEUDO_REGISTER.match(piece):
        return resolver.pseudo_register(piece[2:].lower())
    if not _NAME.match(piece):
        raise BadInput("bad token '%s' in '%s'" % (piece, text))
    if "!" not in piece:
        base = resolver.module_base(piece)
        if base is not None:
            return base
    address = resolver.address(piece)
    if address is None:
        raise SymbolNotFound("unknown symbol '%s' in '%s'" % (piece, text))
    return address


def evaluate_count(text, resolver):
    """A count: an expression (hex by default) with an optional ``L`` prefix."""
    match = _LENGTH.match(text.strip())
    return evaluate(match.group(2) if match else text, resolver)


def parse_range(tokens, start, unit, default_count, resolver):
    """Unit count for ``d*`` commands from the tokens after the start address:
    nothing (the default), ``L<count>`` / ``L <count>`` / ``L?<count>``, or an
    inclusive end address."""
    text = " ".join(tokens).strip()
    if not text:
        return default_count
    match = _LENGTH.match(text)
    if match:
        count = evaluate(match.group(2), resolver)
        if count == 0:
            raise BadInput("length must be at least 1 (got '%s')" % text)
        return count
    end = evaluate(text, resolver)
    if end < start:
        raise BadInput("range end %s is below the start address 0x%x" % (text, start))
    return (end - start) // unit + 1


def merge_ranges(ranges):
    """Sorted (start, end) ranges with touching and overlapping ones joined."""
    merged = []
    for start, end in sorted(ranges):
        if merged and merged[-1][1] >= start:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged
