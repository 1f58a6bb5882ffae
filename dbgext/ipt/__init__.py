"""Intel Processor Trace: decode IPT buffers and reconstruct execution against the
code in target memory (``dbgext ipt packets|flow|event|scan``).

Layers, each usable on its own (like libipt's):

1. :mod:`.packets` — packet decoder (regex tokenizer, last-IP decompression, PSB
   resync, ``packet_stats`` for totals);
2. :mod:`.sources` — raw buffers, ETW IntelProcessorTrace events (header and
   ``_IPT_OPTION``), ipt.sys process traces, wrapped rings, scans of target memory;
3. :mod:`.flow` — instruction flow with capstone over cached basic blocks;
4. :mod:`.views` / :mod:`.render` — listings, condensed path, call tree, counts.

:func:`.fixtures.add_sample_trace` puts a decodable sample into a Scenario.
"""
