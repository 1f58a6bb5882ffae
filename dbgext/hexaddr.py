"""Addresses as WinDbg prints them, for every layer: problems and errors name
addresses too, so this sits below the target, the analyses and the renderers."""


def hexaddr(address, pointer_size=8):
    """An address as WinDbg prints it: ``fffff800`00001000`` for 64-bit targets,
    ``80001000`` for 32-bit ones (and for 64-bit values that fit, when
    ``pointer_size`` is 4)."""
    if address is None:
        return "?"
    if pointer_size == 8 or address > 0xFFFFFFFF:
        return "%08x`%08x" % ((address >> 32) & 0xFFFFFFFF, address & 0xFFFFFFFF)
    return "%08x" % address
