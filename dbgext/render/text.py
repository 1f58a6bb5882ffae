"""Plain-text formatting for the renderers: WinDbg-style addresses (defined in
:mod:`dbgext.hexaddr`, below every layer, since problems and errors name addresses)."""

from ..hexaddr import hexaddr

__all__ = ["hexaddr"]
