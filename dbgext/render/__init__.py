"""Renderers: turn analysis data objects into text tables, JSON or WinDbg DML.
A renderer never reads target memory."""
