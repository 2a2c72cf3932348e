"""Atomic writes of files, JSON records and whole directories."""

import os
import shutil

import pytest

from trainer.storage import files


def test_write_text_replaces_and_leaves_no_temporary(tmp_path):
  path = str(tmp_path / "sub" / "file.txt")
  files.write_text(path, "one")
  files.write_text(path, "two")
  with open(path) as f:
    assert f.read() == "two"
  assert os.listdir(tmp_path / "sub") == ["file.txt"]


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o027, 0o640),
                                        (0o002, 0o664)])
def test_written_files_follow_the_umask(tmp_path, umask, mode):
  previous = os.umask(umask)
  try:
    path = str(tmp_path / "record.json")
    files.write_json(path, {"step": 1})
    with open(tmp_path / "plain", "w") as f:  # What `open` gives, for scale.
      f.write("x")
  finally:
    os.umask(previous)
  assert os.stat(path).st_mode & 0o777 == mode
  assert os.stat(tmp_path / "plain").st_mode & 0o777 == mode


def test_json_round_trip_and_missing_file(tmp_path):
  path = str(tmp_path / "record.json")
  assert files.read_json(path) is None
  files.write_json(path, {"step": 400, "value": 0.975})
  assert files.read_json(path) == {"step": 400, "value": 0.975}


def _fill_with(content):
  def fill(directory):
    os.makedirs(directory)
    with open(os.path.join(directory, "data"), "w") as f:
      f.write(content)
  return fill


def test_write_directory_creates_and_replaces_whole(tmp_path):
  target = str(tmp_path / "export" / "100")
  files.write_directory(target, _fill_with("first"))
  files.write_directory(target, _fill_with("second"))
  with open(os.path.join(target, "data")) as f:
    assert f.read() == "second"
  assert os.listdir(tmp_path / "export") == ["100"]


def test_failed_write_directory_leaves_the_old_one(tmp_path):
  target = str(tmp_path / "100")
  files.write_directory(target, _fill_with("good"))

  def broken(directory):
    _fill_with("half")(directory)
    raise OSError("disk full")

  with pytest.raises(OSError, match="disk full"):
    files.write_directory(target, broken)
  with open(os.path.join(target, "data")) as f:
    assert f.read() == "good"
  assert os.listdir(tmp_path) == ["100"]


def test_a_write_under_a_deleted_root_makes_nothing(tmp_path):
  root = tmp_path / "run"
  root.mkdir()
  path = str(root / "eval" / "record.json")
  assert files.write_json(path, {"step": 1}, root=str(root)) is True
  assert files.read_json(path) == {"step": 1}
  root.joinpath("eval", "record.json").unlink()
  root.joinpath("eval").rmdir()
  root.rmdir()  # The user's `rm -r` under the run.
  assert files.write_json(path, {"step": 2}, root=str(root)) is False
  assert files.write_text(path, "x", root=str(root)) is False
  assert not root.exists()
  # Without `root`, the folders are made, as before.
  assert files.write_text(path, "x") is True and root.exists()


def test_a_root_deleted_during_the_write_is_not_an_error(tmp_path,
                                                          monkeypatch):
  """Deleted between the temporary file and the rename (the user's `rm -r`
  under the run): nothing is written and nothing made again."""
  root = tmp_path / "run"
  root.mkdir()
  replace = os.replace

  def delete_then_replace(source, target):
    shutil.rmtree(root)
    replace(source, target)

  monkeypatch.setattr(os, "replace", delete_then_replace)
  assert files.write_json(str(root / "eval" / "record.json"), {"step": 1},
                          root=str(root)) is False
  assert not root.exists()


def test_only_the_folders_below_root_are_made(tmp_path, monkeypatch):
  root = tmp_path / "run"
  root.mkdir()
  made = []
  mkdir = os.mkdir

  def recording_mkdir(path, *args):
    made.append(path)
    mkdir(path, *args)

  monkeypatch.setattr(os, "mkdir", recording_mkdir)
  path = root / "eval" / "clean" / "images" / "x.png"
  assert files.write_bytes(str(path), b"png", root=str(root)) is True
  assert path.read_bytes() == b"png"
  assert made == [str(root / "eval"), str(root / "eval" / "clean"),
                  str(root / "eval" / "clean" / "images")]


def test_a_missing_file_with_root_there_is_raised(tmp_path, monkeypatch):
  def lost(source, target):
    raise FileNotFoundError("lost")

  monkeypatch.setattr(os, "replace", lost)
  with pytest.raises(FileNotFoundError, match="lost"):
    files.write_text(str(tmp_path / "a.txt"), "x", root=str(tmp_path))
