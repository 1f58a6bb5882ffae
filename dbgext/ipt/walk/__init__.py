"""The flow's walk: the code followed along the trace items (dbgext.ipt.flow makes
the items and the blocks, and runs a Walk per decode).

kinds.py holds the vocabulary the flow and the walk share (execution modes, block
kinds, trace items).  The walk is one class, Walk, built in five parts, each a
module and a class that builds on the one before, each owning its own state:

* state.py, WalkState: the decoder state (trace position, mode, TNT bits, return
  stack, the instructions walked and how many of them are committed), events and
  errors;
* reader.py, ItemReader: the one item reader (read: peek, item, next_item;
  items_ahead, pushed, lookahead; split, an interrupt item as its FUP and TIP), which also handles the items that are no step
  (errors, events without IP, PSB+ while walking);
* events.py, EventBinder: events while tracing is on (FUP binding, TSX, interrupt
  flag, EXSTOP, PTW, TIP.PGD binding; BDM64, SKD022);
* resume.py, Resumer: tracing off and resuming (TIP.PGE, PSB+, overflow with
  APL11, APL12, SKD010 and BDM70, resynchronising after an error, gaps in the
  code);
* step.py, Walk: the per-block step (a TNT bit, TIP or return address per branch)
  and the driver (``Walk.run``).
"""
