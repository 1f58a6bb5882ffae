"""Intel Processor Trace: decode IPT buffers and reconstruct execution against the
code in target memory (``dbgext ipt packets|flow|event|scan``).

Scripts call one function per action, with keyword arguments, each returning one
result type with ``as_dict()`` (the ``--json`` document, docs/json-schema/ipt.md)
and ``problems`` (a ProblemLog):

* ``list_packets(target, trace=..., stats=...)`` -> PacketsResult;
* ``reconstruct_flow(target, trace=..., images=[(path, base)], view=...)`` -> FlowAnalysis;
* ``decode_event(target, address=...)`` -> EventResult;
* ``scan_events(target, etl=..., start=..., length=...)`` -> ScanResult.

Layers, each usable on its own (like libipt's):

1. :mod:`.packets` — packet decoder (regex tokenizer, last-IP decompression, PSB
   resync, ``packet_stats`` for totals);
2. :mod:`.sources` — raw buffers, ETW IntelProcessorTrace events (header and
   ``_IPT_OPTION``), ipt.sys process traces, wrapped rings, scans of target memory;
3. :mod:`.flow` — instruction flow with capstone over cached basic blocks, with
   libipt's conventions (:mod:`.errata` for its CPU errata workarounds);
4. :mod:`.views` / :mod:`.render` — path, call tree, function counts; text output;
5. :mod:`.analysis` — those functions and their results.

:func:`.fixtures.add_sample_trace` puts a decodable sample into a Scenario.
"""

from .analysis import (FLOW_VIEWS, SCHEMA_VERSION, EventResult, FlowAnalysis, FlowBuffer, PacketBuffer,
                       PacketsResult, ScanResult, decode_event, list_packets, load_buffers, reconstruct_flow,
                       scan_events)

__all__ = ["FLOW_VIEWS", "SCHEMA_VERSION", "EventResult", "FlowAnalysis", "FlowBuffer", "PacketBuffer",
           "PacketsResult", "ScanResult", "decode_event", "list_packets", "load_buffers", "reconstruct_flow",
           "scan_events"]
