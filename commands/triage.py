import os, sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(sys.argv[0]))))
from dbgext.cli import main
main(["triage"] + sys.argv[1:], windbg=True)
