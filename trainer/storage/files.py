"""Atomic writes: a reader (or a crash) sees the old content or the new one.

Everything the framework writes besides checkpoints goes through here: the
operative config, JSON records (best checkpoint, early stopping, evaluated
checkpoints) and SavedModel exports. Checkpoints are written atomically by
TensorFlow itself (a `_temp` folder renamed when complete).
"""

import json
import os
import shutil
import tempfile
import uuid
from typing import Any, Callable, Optional, Tuple

# What every temporary file or folder of an atomic write starts with.
TEMPORARY_PREFIX = ".tmp-"


def _umask() -> int:
  mask = os.umask(0)  # The only way to read it is to set it.
  os.umask(mask)
  return mask


def write_text(path: str, text: str, root: Optional[str] = None) -> bool:
  """Writes `text` to `path` through a temporary file and a rename.

  The file gets the mode an `open(path, "w")` would (0644 under umask 022),
  like the checkpoints beside it, not the temporary file's 0600.

  Args:
    path: The file written.
    text: Its content.
    root: The run's `model_dir`, above `path`. Where it is gone (the user
      deleted it under the run) before or during the write, nothing is
      written and nothing made again: the run's next checkpoint save stops
      it, saying so. Only the folders below it are made.

  Returns:
    Whether `path` was written (False only where `root` is gone).
  """
  return write_bytes(path, text.encode("utf-8"), root)


def write_bytes(path: str, data: bytes, root: Optional[str] = None) -> bool:
  """Writes `data` to `path` as `write_text` writes text; returns whether
  it was written."""
  directory = os.path.dirname(path) or "."
  try:
    _make_below(root, directory)
    _write_and_rename(path, directory, data)
  except FileNotFoundError:
    if directory_gone(root):
      return False
    raise
  return True


def _make_below(root: Optional[str], directory: str) -> None:
  """Makes `directory` and its missing parents, but not `root` (None:
  any), nor anything above it.

  Raises:
    FileNotFoundError: If `root` is missing.
  """
  if root is None:
    os.makedirs(directory, exist_ok=True)
    return
  if not os.path.isdir(root):
    raise FileNotFoundError(f"{root} is gone")
  below = os.path.relpath(directory, root)
  if below == os.curdir:
    return
  if below.split(os.sep)[0] == os.pardir:
    raise ValueError(f"{directory} is not inside {root}")
  path = root
  # One level at a time: `os.makedirs` would make `root` again too.
  for part in below.split(os.sep):
    path = os.path.join(path, part)
    try:
      os.mkdir(path)
    except FileExistsError:
      pass


def _write_and_rename(path: str, directory: str, data: bytes) -> None:
  """Writes `data` to a temporary file in `directory`, renamed to `path`."""
  # Named after `path`, so a cleanup can tell whose write it was.
  with tempfile.NamedTemporaryFile("wb", dir=directory, delete=False,
                                   prefix=(f"{TEMPORARY_PREFIX}"
                                           f"{os.path.basename(path)}-"),
                                   suffix=".part") as f:
    try:
      f.write(data)
      f.flush()
      os.fchmod(f.fileno(), 0o666 & ~_umask())
      os.fsync(f.fileno())
    except BaseException:
      os.remove(f.name)  # A full disk leaves no partial file behind.
      raise
  os.replace(f.name, path)


def write_json(path: str, value: Any, root: Optional[str] = None) -> bool:
  """Writes `value` as indented JSON, atomically (`root`: as
  `write_text`'s); returns whether it was written."""
  return write_text(path, json.dumps(value, indent=2, sort_keys=True) + "\n",
                    root=root)


def directory_identity(directory: str) -> Optional[Tuple[int, int]]:
  """`(device, inode)` of a local directory, which tells it from one made
  again under the same name; None if it is missing or not local
  (`gs://...`)."""
  try:
    status = os.stat(directory)
  except OSError:
    return None
  return (status.st_dev, status.st_ino)


def directory_gone(model_dir: Optional[str]) -> bool:
  """Whether `model_dir` (None: none to watch) is no longer there: deleted
  under the run, which nothing may make again."""
  return model_dir is not None and not os.path.isdir(model_dir)


def read_json(path: str) -> Optional[Any]:
  """Returns the JSON value in `path`, or None if there is no such file."""
  try:
    with open(path) as f:
      return json.load(f)
  except FileNotFoundError:
    return None


def write_directory(path: str, fill: Callable[[str], None]) -> None:
  """Creates directory `path` whole: `fill(tmp)` writes a temporary sibling,
  which is then renamed to `path` (replacing an older `path`).

  If `fill` fails, the temporary directory is removed and `path` is left
  as it was.
  """
  parent = os.path.dirname(path) or "."
  os.makedirs(parent, exist_ok=True)
  temporary = os.path.join(
      parent,
      f"{TEMPORARY_PREFIX}{os.path.basename(path)}-{uuid.uuid4().hex[:8]}")
  try:
    fill(temporary)
    if os.path.isdir(path):
      # Rename the old one away first: `os.replace` cannot replace a
      # non-empty directory.
      stale = temporary + ".old"
      os.replace(path, stale)
      os.replace(temporary, path)
      shutil.rmtree(stale, ignore_errors=True)
    else:
      os.replace(temporary, path)
  finally:
    shutil.rmtree(temporary, ignore_errors=True)
