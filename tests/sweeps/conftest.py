"""A sweep directory at a URL: TensorFlow's in-process `ram://`."""

import os

import pytest


@pytest.fixture
def url_sweep_dir(tmp_path, monkeypatch):
  """A `ram://` sweep directory; the working directory and the cache of
  local copies (`XDG_CACHE_HOME`) in `tmp_path`. Afterwards, the working
  directory must hold nothing: no `ram:` folder, nothing at all."""
  work = tmp_path / "work"
  work.mkdir()
  monkeypatch.chdir(work)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  yield f"ram://{tmp_path.name}/sweep"
  assert not os.listdir(work)
