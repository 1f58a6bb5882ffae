"""WinDbg-familiar memory display and module listing: ``db``, ``dd``, ``dq``, ``dps``,
``lm`` — offline over dumps and inside WinDbg through the same code."""
