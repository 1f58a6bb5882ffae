"""``k``: a thread's call stack, as WinDbg's ``k``, ``kf`` and ``kv`` show it.

    dbgext k [COUNT] --dump FILE [--thread ID|~N|KTHREAD | --trap KTRAP_FRAME] [--frame-sizes]
             [--verbose] [--image-path DIR] [--json]
"""

from ..command import Command
from ..errors import EXIT_ERROR, BadInput, UnreadableMemory
from .images import images_from_directories
from .render import render_stack, stack_diagnostics
from .threads import trap_frame_thread
from .walk import MAX_FRAMES, analyze


def add_arguments(parser):
    parser.add_argument("count", nargs="?", help="how many frames at most (hex, 0n decimal; default 0x%x)"
                        % MAX_FRAMES)
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--thread", metavar="THREAD", help="thread to walk: a thread id or ~index of the "
                       "dump, or a KTHREAD address (default: the crashing/current thread)")
    start.add_argument("--trap", metavar="ADDRESS", help="start from the registers of the _KTRAP_FRAME at "
                       "ADDRESS (like .trap; x64 and ARM64 kernel)")
    parser.add_argument("--frame-sizes", "-f", action="store_true",
                        help="kf: add the Memory column (stack bytes between frames)")
    parser.add_argument("--verbose", "-v", action="store_true",
                        help="kv: add the arguments, how each frame was found and trap frames")
    parser.add_argument("--image-path", metavar="DIR", action="append",
                        help="directory of module images (like .exepath) for unwind data the dump lacks "
                        "(repeatable)")


def _thread(ctx, text):
    """A thread of the target by id or ~index; on a kernel target, else a KTHREAD address."""
    target = ctx.target
    try:
        return target.select_thread(text)
    except BadInput:
        if text.strip().startswith("~") or (target.info() or {}).get("mode") != "kernel":
            raise
    return ctx.address(text)


def _trap_frame(ctx, text):
    address = ctx.address(text)
    try:
        return trap_frame_thread(ctx.target, address)
    except UnreadableMemory as error:
        raise BadInput("the trap frame at %s is unreadable (at %s)" % (
            ctx.target.format_address(address), ctx.target.format_address(error.address)))


def run(ctx, args):
    target = ctx.target
    if args.trap is not None:
        thread = _trap_frame(ctx, args.trap)
    else:
        thread = _thread(ctx, args.thread) if args.thread is not None else None
    max_frames = ctx.count(args.count) if args.count is not None else MAX_FRAMES
    loader = images_from_directories(args.image_path) if args.image_path else None
    result = analyze(target, thread=thread, max_frames=max_frames, image_loader=loader)
    if args.json:
        ctx.out.json(result.as_dict())
    elif result.frames:
        render_stack(ctx.out, result, target.format_address, frame_sizes=args.frame_sizes, verbose=args.verbose)
        ctx.err.lines(stack_diagnostics(result, verbose=args.verbose))
    if not result.frames:
        for problem in result.problems:
            ctx.err.line("error: %s" % problem.message)
        return EXIT_ERROR
    return 0


COMMAND = Command("k", "a thread's call stack from its unwind data (WinDbg's k, kf, kv)", add_arguments, run)
