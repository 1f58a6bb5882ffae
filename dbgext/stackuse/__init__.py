"""Stack usage: per-function frame sizes (unwind data and prologue analysis),
worst-case call chains, and a kf-like view of a thread's stack consumption."""
