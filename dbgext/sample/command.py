"""``dbgext sample`` (write the bundled sample dump) and ``dbgext demo`` (the main
job on the sample: every analysis, one after another)."""

import os

from ..command import Command
from . import MANIFEST_FORMAT, load_manifest, write_sample


def _sample_arguments(parser):
    parser.add_argument("--out", metavar="DIR", required=True, help="directory to write the sample into")
    parser.add_argument("--force", action="store_true", help="replace the files of an existing sample")


def _run_sample(ctx, args):
    dump_path = write_sample(args.out, force=args.force)
    ctx.out.line("wrote %s (symbols in %s.symbols, manifest sample.json)" % (dump_path, dump_path))
    return 0


def default_demo_directory():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dbgext", "sample")


def demo_steps(dump_path, manifest):
    """(title, argv) of every demo step, on the sample's contents."""
    contents = manifest["contents"]
    dump = ["--dump", dump_path]
    database = "0x%x" % contents["rtltrace"]
    ipt = contents["ipt"]
    return [
        ("What the dump holds", ["dumpinfo"] + dump), ("Loaded modules", ["lm"] + dump),
        ("The crashing thread's stack", ["k"] + dump),
        ("Stack-trace database", ["rtltrace"] + dump + [database, "--limit", "5"]),
        ("Trace database validation", ["rtltrace"] + dump + [database, "--validate"]),
        ("ETW stack caches", ["etwstacks"] + dump),
        ("Intel PT event", ["ipt", "event"] + dump + ["--address", "0x%x" % ipt["event_address"]]),
        ("Intel PT flow", ["ipt", "flow"] + dump + ["--address", "0x%x" % ipt["trace_address"],
                                                   "--size", "0x%x" % ipt["trace_size"], "--view", "calltree"]),
        ("Kernel stack usage of the crashing thread", ["stackuse", "thread"] + dump),
        ("Triage record of the whole dump", ["triage"] + dump),
    ]


def _demo_arguments(parser):
    parser.add_argument("--out", metavar="DIR", help="where to build the sample (default: %s)"
                        % default_demo_directory())
    parser.add_argument("--rebuild", action="store_true", help="rebuild the sample even if it exists")


def _run_demo(ctx, args):
    from ..cli import main
    directory = args.out or default_demo_directory()
    dump_path = os.path.join(directory, "sample.dmp")
    manifest = load_manifest(directory) if os.path.exists(os.path.join(directory, "sample.json")) else None
    if args.rebuild or manifest is None or manifest.get("format") != MANIFEST_FORMAT:
        ctx.out.line("building the sample kernel dump in %s ..." % directory)
        # The demo's folder is its own cache: --rebuild, or a sample of an older
        # format, is what replaces it.
        write_sample(directory, force=args.rebuild or manifest is not None, force_option="--rebuild")
        manifest = load_manifest(directory)
    worst = 0
    for title, argv in demo_steps(dump_path, manifest):
        ctx.out.line("")
        ctx.out.line("=" * 78)
        ctx.out.line("%s:  dbgext %s" % (title, " ".join(argv)))
        ctx.out.line("=" * 78)
        worst = max(worst, main(argv, stream=ctx.out.stream, error_stream=ctx.err.stream))
    return worst


COMMANDS = [
    Command("sample", "write the bundled sample kernel dump and its ISF symbols", _sample_arguments,
            _run_sample, needs_target=False, json_option=False),
    Command("demo", "build the sample dump (once) and run every analysis on it", _demo_arguments,
            _run_demo, needs_target=False, json_option=False),
]
