"""Every file a command writes goes through ``dbgext.outputs``: never through a
link, never over an existing file without the force option, never half-written
(a temporary file in the same folder, renamed into place when complete)."""

import io
import os

import pytest

from dbgext import outputs
from dbgext.cli import main
from dbgext.errors import BadInput


def run(*argv):
    stream = io.StringIO()
    code = main(list(argv), stream=stream)
    return code, stream.getvalue()


def leftovers(folder):
    return [name for name in os.listdir(folder) if name.endswith(".partial")]


def test_a_written_file_replaces_nothing_without_force_and_everything_with_it(tmp_path):
    path = str(tmp_path / "out.txt")
    outputs.write_text(path, "first")
    with pytest.raises(BadInput, match="out.txt already exists \\(give --force to replace it\\)"):
        outputs.write_text(path, "second")
    outputs.write_text(path, "third", force=True)
    assert open(path).read() == "third" and leftovers(str(tmp_path)) == []


def test_a_link_at_the_output_name_is_refused_even_with_force_and_its_target_is_untouched(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    os.symlink(str(victim), str(tmp_path / "out.txt"))
    for force in (False, True):
        with pytest.raises(BadInput, match="out.txt is a symbolic link: refusing to write through it"):
            outputs.write_text(str(tmp_path / "out.txt"), "overwritten", force=force)
    assert victim.read_text() == "keep" and os.path.islink(str(tmp_path / "out.txt"))


def test_a_dangling_link_is_refused_too(tmp_path):
    os.symlink(str(tmp_path / "nowhere" / "file"), str(tmp_path / "out.txt"))
    with pytest.raises(BadInput, match="symbolic link"):
        outputs.write_text(str(tmp_path / "out.txt"), "x", force=True)
    assert not os.path.exists(str(tmp_path / "nowhere"))


def test_a_writer_that_fails_leaves_the_old_file_and_no_partial_file(tmp_path):
    path = str(tmp_path / "out.bin")
    outputs.write_text(path, "old")
    with pytest.raises(RuntimeError):
        with outputs.replacing(path, force=True) as partial:
            with open(partial, "w") as handle:
                handle.write("half")
            raise RuntimeError("the writer failed")
    assert open(path).read() == "old" and leftovers(str(tmp_path)) == []


def test_an_output_folder_that_is_a_link_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    os.symlink(str(tmp_path / "elsewhere"), str(tmp_path / "folder"))
    with pytest.raises(BadInput, match="folder is a symbolic link"):
        outputs.output_directory(str(tmp_path / "folder"))


def test_written_files_get_the_usual_permissions_not_the_temporary_files_0600(tmp_path):
    path = str(tmp_path / "out.txt")
    outputs.write_text(path, "x")
    mask = os.umask(0o022)
    os.umask(mask)
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~mask


def test_sample_refuses_to_replace_an_existing_sample_without_force(tmp_path):
    out = str(tmp_path / "out")
    assert run("sample", "--out", out)[0] == 0
    before = os.path.getmtime(os.path.join(out, "sample.dmp"))
    code, text = run("sample", "--out", out)
    assert code == 1 and text.strip() == "error: %s already exists (give --force to replace it)" % os.path.join(
        out, "sample.dmp")
    assert os.path.getmtime(os.path.join(out, "sample.dmp")) == before
    assert run("sample", "--out", out, "--force")[0] == 0
    assert leftovers(out) == [] and leftovers(os.path.join(out, "sample.dmp.symbols")) == []


def test_sample_checks_every_file_before_writing_any(tmp_path):
    out = tmp_path / "out"
    (out / "sample.dmp.symbols").mkdir(parents=True)
    (tmp_path / "victim.json").write_text("keep")
    os.symlink(str(tmp_path / "victim.json"), str(out / "sample.dmp.symbols" / "nt.json"))
    code, text = run("sample", "--out", str(out))
    assert code == 1 and "nt.json is a symbolic link" in text
    assert sorted(os.listdir(str(out))) == ["sample.dmp.symbols"]   # not even the dump was written
    assert (tmp_path / "victim.json").read_text() == "keep"


def test_triage_out_through_a_link_is_refused_even_with_force(tmp_path):
    assert run("sample", "--out", str(tmp_path))[0] == 0
    (tmp_path / "victim.json").write_text("keep")
    os.symlink(str(tmp_path / "victim.json"), str(tmp_path / "record.json"))
    code, text = run("triage", "--dump", str(tmp_path / "sample.dmp"), "--out", str(tmp_path / "record.json"),
                     "--force", "--analyses", "rtltrace")
    assert code == 1 and "record.json is a symbolic link" in text
    assert (tmp_path / "victim.json").read_text() == "keep"
