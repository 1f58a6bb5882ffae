"""Writing output files: never through a link, never over a file without
``--force``, never half-written.

Every command that writes a file (``sample``, ``demo``, ``triage --out``, the
``--parquet`` export, the ``--db`` it creates) goes through here.  A file is
written under a fresh temporary name in its own folder (created exclusively, so
it follows no link) and renamed over the final name only when complete; the final
name is checked before the work and again just before the rename: a symbolic
link (or, on Windows, any reparse point such as a junction) is refused in one
line, and so is an existing file unless the caller's force option was given.  A
folder an output goes into is refused the same way when it is a link.
"""

import contextlib
import io
import os
import stat
import tempfile

from .errors import BadInput


def is_link(path):
    """Whether ``path`` itself (not what it points at) is a symbolic link or a
    Windows reparse point."""
    try:
        status = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISLNK(status.st_mode) or bool(
        getattr(status, "st_file_attributes", 0) & stat.FILE_ATTRIBUTE_REPARSE_POINT)


def refuse_link(path):
    """BadInput when ``path`` is a link: an output is never written through one."""
    if is_link(path):
        raise BadInput("%s is a symbolic link: refusing to write through it (remove it or choose another name)"
                       % path)


def check_output(path, force=False, force_option="--force"):
    """Refuse an output file name in one line: a link always, a folder always, an
    existing file unless ``force``."""
    refuse_link(path)
    if os.path.isdir(path):
        raise BadInput("%s is a folder, not a file" % path)
    if os.path.lexists(path) and not force:
        raise BadInput("%s already exists (give %s to replace it)" % (path, force_option))


def output_directory(path):
    """Create the folder ``path`` (and its parents) for outputs; refuse it when it
    is a link or a file."""
    refuse_link(path)
    if os.path.lexists(path) and not os.path.isdir(path):
        raise BadInput("%s is a file, not a folder" % path)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as error:
        raise BadInput("cannot create %s: %s" % (path, error.strerror or error))
    return path


@contextlib.contextmanager
def replacing(path, force=False, force_option="--force"):
    """``with replacing(path) as partial:`` write the output to ``partial`` (a new
    file in ``path``'s folder); on a clean exit it becomes ``path``, otherwise it
    is removed.  Refusals as :func:`check_output`."""
    check_output(path, force, force_option)
    directory = os.path.dirname(os.path.abspath(path))
    try:
        handle, partial = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), suffix=".partial", dir=directory)
    except OSError as error:
        raise BadInput("cannot write %s: %s" % (path, error.strerror or error))
    os.close(handle)
    try:
        yield partial
        check_output(path, force, force_option)
        os.chmod(partial, 0o666 & ~_umask())   # mkstemp's 0600 is for the partial file only
        os.replace(partial, path)
    except OSError as error:
        raise BadInput("cannot write %s: %s" % (path, error.strerror or error))
    finally:
        if os.path.lexists(partial):
            os.remove(partial)


def write_text(path, text, force=False, force_option="--force"):
    """Write ``text`` (UTF-8) to ``path`` as :func:`replacing` does."""
    with replacing(path, force, force_option) as partial:
        with io.open(partial, "w", encoding="utf-8") as stream:
            stream.write(text)
    return path


def _umask():
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
