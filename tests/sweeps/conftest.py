"""A sweep directory at a URL: TensorFlow's in-process `ram://`."""

import os

import pytest

from trainer.storage import files


@pytest.fixture
def url_sweep_dir(tmp_path, monkeypatch):
  """A `ram://` sweep directory; the working directory and the cache of
  local copies (`XDG_CACHE_HOME`) in `tmp_path`. Afterwards, the working
  directory must hold nothing: no `ram:` folder, nothing at all.

  TensorFlow 2.20's `ram://` appends to a file written again, where an
  object store (`gs://`) replaces the object: here a write or copy to
  `ram://` replaces it too, as on the stores the sweep is for.
  """
  write_bytes, copy = files.write_bytes, files.copy

  def replacing_write(path, data, root=None):
    if files.scheme(path) == "ram":
      files.remove(path)
    return write_bytes(path, data, root)

  def replacing_copy(source, target):
    if files.scheme(target) == "ram":
      files.remove(target)
    copy(source, target)

  monkeypatch.setattr(files, "write_bytes", replacing_write)
  monkeypatch.setattr(files, "copy", replacing_copy)
  work = tmp_path / "work"
  work.mkdir()
  monkeypatch.chdir(work)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  yield f"ram://{tmp_path.name}/sweep"
  assert not os.listdir(work)
