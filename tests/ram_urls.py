"""A `ram://` run directory, for tests of what lands under a URL model_dir.

TensorFlow's in-process `ram://` file system stands in for `gs://`: the
framework reaches both through `tf.io.gfile`, and a path written through
`os` instead would make a local folder named `ram:`. It lives in the test's
process only, so only in-process runs can use it. (Where it differs from
an object store, appending to a file opened for writing, the file layer
removes the old file first.)
"""

import os

import tensorflow as tf

from trainer.storage import files


def model_dir(tmp_path, monkeypatch, mark: bool = True) -> str:
  """A `ram://` model_dir unique to the test, taken by the run (`mark`:
  given its identity, as the run gives it); the working directory moved to
  `tmp_path`, where `nothing_local` looks."""
  monkeypatch.chdir(tmp_path)
  url = f"ram://{tmp_path.name}/run"
  if mark:
    files.mark_directory(url)
  return url


def nothing_local(tmp_path) -> bool:
  """Whether nothing of a URL went to a local `ram:` folder."""
  return not os.path.exists(tmp_path / "ram:")


def names(url: str):
  """The paths of every file below `url`, relative to it, sorted."""
  return sorted(os.path.join(directory, name)[len(url) + 1:]
                for directory, _, found in tf.io.gfile.walk(url)
                for name in found)
