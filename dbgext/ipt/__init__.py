"""Intel Processor Trace: decode IPT buffers and reconstruct execution against the
code in target memory (``dbgext ipt packets|flow|event|scan``).

Scripts use :func:`analyze` (``dbgext.ipt.analyze(target, "flow", trace=..., images=...)``)
and the result types it returns; each has ``as_dict()`` (the ``--json`` document,
docs/json-schema/ipt.md) and ``problems`` (a ProblemLog).

Layers, each usable on its own (like libipt's):

1. :mod:`.packets` — packet decoder (regex tokenizer, last-IP decompression, PSB
   resync, ``packet_stats`` for totals);
2. :mod:`.sources` — raw buffers, ETW IntelProcessorTrace events (header and
   ``_IPT_OPTION``), ipt.sys process traces, wrapped rings, scans of target memory;
3. :mod:`.flow` — instruction flow with capstone over cached basic blocks, with
   libipt's conventions (:mod:`.errata` for its CPU errata workarounds);
4. :mod:`.views` / :mod:`.render` — path, call tree, function counts; text output;
5. :mod:`.analysis` — :func:`analyze` and the results.

:func:`.fixtures.add_sample_trace` puts a decodable sample into a Scenario.
"""

from .analysis import (ACTIONS, FLOW_VIEWS, SCHEMA_VERSION, EventResult, FlowAnalysis, FlowBuffer,
                       PacketBuffer, PacketsResult, ScanResult, analyze, load_buffers)

__all__ = ["ACTIONS", "FLOW_VIEWS", "SCHEMA_VERSION", "EventResult", "FlowAnalysis", "FlowBuffer", "PacketBuffer",
           "PacketsResult", "ScanResult", "analyze", "load_buffers"]
