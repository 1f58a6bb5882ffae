"""Fixture builds cached between test runs: compiled in a private folder and renamed
into place when complete, so a concurrent run never reads a half-written file."""

import os
import shutil
import subprocess
import tempfile


def build_into(root, final, commands):
    """Run ``commands`` (argument lists) in a fresh folder under ``root`` and make
    it ``final``; RuntimeError with the tool's output when one fails."""
    os.makedirs(root, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="build-", dir=root)
    for command in commands:
        done = subprocess.run(command, cwd=scratch, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if done.returncode != 0:
            shutil.rmtree(scratch, ignore_errors=True)
            raise RuntimeError("%s failed:\n%s" % (" ".join(command), done.stdout.decode(errors="replace")))
    try:
        os.rename(scratch, final)
    except OSError:  # a concurrent run finished the same build first
        shutil.rmtree(scratch, ignore_errors=True)
