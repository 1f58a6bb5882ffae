"""``dbgext sample`` (write the bundled sample dump) and ``dbgext demo`` (the main
job on the sample: every analysis, one after another)."""

import os

from ..command import Command
from . import load_manifest, write_sample


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
    """(title, argv) of every demo step the sample's contents allow."""
    contents = manifest["contents"]
    dump = ["--dump", dump_path]
    steps = [("What the dump holds", ["dumpinfo"] + dump), ("Loaded modules", ["lm"] + dump),
             ("The crashing thread's stack", ["k"] + dump)]
    if "rtltrace" in contents:
        steps.append(("Stack-trace database", ["rtltrace"] + dump + ["0x%x" % contents["rtltrace"], "--limit", "5"]))
        steps.append(("Trace database validation", ["rtltrace"] + dump + ["0x%x" % contents["rtltrace"], "--validate"]))
    if "etwstacks" in contents:
        steps.append(("ETW stack caches", ["etwstacks"] + dump))
    if "ipt" in contents:
        ipt = contents["ipt"]
        steps.append(("Intel PT event", ["ipt", "event"] + dump + ["--address", "0x%x" % ipt["event_address"]]))
        steps.append(("Intel PT flow", ["ipt", "flow"] + dump + ["--address", "0x%x" % ipt["trace_address"],
                                                                  "--size", "0x%x" % ipt["trace_size"], "--view", "calltree"]))
    if "stackuse" in contents:
        steps.append(("Kernel stack usage of the crashing thread", ["stackuse", "thread"] + dump))
    steps.append(("Triage record of the whole dump", ["triage"] + dump))
    return steps


def _demo_arguments(parser):
    parser.add_argument("--out", metavar="DIR", help="where to build the sample (default: %s)"
                        % default_demo_directory())
    parser.add_argument("--rebuild", action="store_true", help="rebuild the sample even if it exists")


def _run_demo(ctx, args):
    from ..cli import main
    directory = args.out or default_demo_directory()
    dump_path = os.path.join(directory, "sample.dmp")
    if args.rebuild or not os.path.exists(os.path.join(directory, "sample.json")):
        ctx.out.line("building the sample kernel dump in %s ..." % directory)
        # The demo's folder is its own cache: --rebuild is what replaces it.
        write_sample(directory, force=args.rebuild, force_option="--rebuild")
    manifest = load_manifest(directory)
    if manifest.get("missing"):
        ctx.out.line("(not in this build: %s)" % ", ".join(manifest["missing"]))
    worst = 0
    for title, argv in demo_steps(dump_path, manifest):
        ctx.out.line("")
        ctx.out.line("=" * 78)
        ctx.out.line("%s:  dbgext %s" % (title, " ".join(argv)))
        ctx.out.line("=" * 78)
        worst = max(worst, main(argv, stream=ctx.out.stream))
    return worst


COMMANDS = [
    Command("sample", "write the bundled sample kernel dump and its ISF symbols", _sample_arguments,
            _run_sample, needs_target=False, json_option=False),
    Command("demo", "build the sample dump (once) and run every analysis on it", _demo_arguments,
            _run_demo, needs_target=False, json_option=False),
]
