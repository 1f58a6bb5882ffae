"""``k``'s text output, laid out as WinDbg's ``k`` / ``kf`` / ``kv``.

Columns: frame number, Child-SP (ChildEBP on x86), RetAddr, Call Site; ``kf``'s
Memory column (bytes between this frame's child-SP and the previous one's);
``kv``'s Args to Child, how each frame was found and trap frames.  Inside WinDbg
the Child-SP opens ``dps`` on the frame and the call site opens ``u`` at it.
Warnings (scanned or unconfirmed frames, the walk's problems) go to stderr.
"""


def render_stack(out, result, format_address, frame_sizes=False, verbose=False):
    x86 = result.arch == "x86"
    headers = ["#"] + (["Memory"] if frame_sizes else []) + ["ChildEBP" if x86 else "Child-SP", "RetAddr"]
    if verbose:
        headers += ["Args to Child", "Found by"]
    headers.append("Call Site")
    rows, links = [], {}
    sp_column = 2 if frame_sizes else 1
    for index, frame in enumerate(result.frames):
        row = ["%02x" % frame.index]
        if frame_sizes:
            row.append("" if frame.memory is None else "%x" % frame.memory)
        base = frame.frame_pointer if x86 and frame.frame_pointer is not None else frame.child_sp
        row += [format_address(base),
                "" if frame.return_address is None else format_address(frame.return_address)]
        if verbose:
            row += [" ".join("?" if value is None else format_address(value) for value in frame.arguments),
                    frame.found_by + (" (unconfirmed)" if frame.unconfirmed else "")]
        call_site = frame.function
        if verbose and frame.trap_frame is not None:
            call_site += " (TrapFrame @ %s)" % format_address(frame.trap_frame)
        elif verbose and frame.machine_frame is not None:
            call_site += " (machine frame @ %s)" % format_address(frame.machine_frame)
        row.append(call_site)
        rows.append(row)
        links[(index, sp_column)] = "dps 0x%x" % base
        links[(index, len(row) - 1)] = "u 0x%x" % frame.ip
    thread = result.thread_source or "thread"
    if result.kernel_thread is not None:
        thread += " (KTHREAD %s)" % format_address(result.kernel_thread)
    out.table(rows, headers, links=links, title=thread)


def stack_diagnostics(result, verbose=False):
    """The lines that go with a rendered stack to the diagnostics stream (stderr):
    notes on scanned and unconfirmed frames, then the walk's problems (among them,
    once, what would give a better stack)."""
    lines = []
    scanned = sum(1 for frame in result.frames if frame.found_by == "scan")
    unconfirmed = sum(1 for frame in result.frames if frame.unconfirmed)
    if scanned and not verbose:
        lines.append("note: %d frame(s) found by scanning the stack: they may be stale (kv shows which)" % scanned)
    if unconfirmed and not verbose:
        lines.append("note: %d frame(s) not confirmed by a call before their return address (kv shows which)"
                     % unconfirmed)
    return lines + [str(problem) for problem in result.problems]
