"""Adapters from each analysis package to a compact triage summary.

This one file holds all the coupling between triage and the analyses: each
adapter calls its package's public API and boils the result down to a small
dict (counts, a few top items, problems).  An adapter whose package is not
installed is registered with ``requires`` and simply skipped.
"""

from .record import register_analysis
