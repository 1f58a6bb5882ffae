"""The flow's walk: the code followed along the trace items (dbgext.ipt.flow makes
the items and the blocks, and runs a Walk per decode).

One class in five parts, each a module that builds on the one before:

* kinds.py: the vocabulary (execution modes, block kinds, trace items);
* state.py: the decoder state (trace position, mode, TNT bits, return stack, the
  instructions walked and how many of them are committed), events and errors;
* reader.py: the one item reader (item, peek, next_item, items_ahead, pushed,
  lookahead), which also handles the items that are no step (errors, events
  without IP, PSB+ while walking);
* events.py: events while tracing is on (FUP binding, TSX, interrupt flag, EXSTOP,
  PTW, TIP.PGD binding; BDM64, SKD022);
* resume.py: tracing off and resuming (TIP.PGE, PSB+, overflow with APL11, APL12,
  SKD010 and BDM70, resynchronising after an error, gaps in the code);
* step.py: the per-block step (a TNT bit, TIP or return address per branch) and the
  driver (``Walk.run``).
"""
