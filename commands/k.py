"""WinDbg entry: `!py <path>\\commands\\k.py <args>` runs `dbgext k <args>`."""
import os
import sys

# WinDbg runs this without __file__; argv[0] is the script's full path.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(sys.argv[0]))))
from dbgext.cli import main  # noqa: E402

main(["k"] + sys.argv[1:], windbg=True)
