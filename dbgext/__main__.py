"""``python -m dbgext``: the same as the ``dbgext`` console script."""

from .cli import console_main

console_main()
