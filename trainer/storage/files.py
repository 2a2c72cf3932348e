"""The one file layer: every path a run reads or writes, local or a URL.

A model_dir, sweep_dir, data dir, warm-start checkpoint or config file may be
a local path or a URL of a file system TensorFlow has registered (`gs://`,
`ram://`, `hdfs://` where installed). Everything the framework reads or
writes at such a path goes through this module; nothing else calls `os.*`,
`open`, `glob`, `shutil` or `tempfile` on one (`tests/storage/
test_file_layer.py` keeps it so). Checkpoints, summaries and SavedModels are
written by TensorFlow itself, which speaks every registered scheme.

Local paths use the operating system directly: a write goes to a temporary
file, fsynced and renamed over the target, so a reader (or a crash) sees the
old content or the new; a directory has an identity (device, inode). URLs go
through `tf.io.gfile`, loaded only then (a local run's fast paths import no
TensorFlow): an object store writes one object whole or not at all, so a file
is written in one piece; it has no atomic rename of a folder, so a folder
written whole is marked complete by an object written last
(`COMPLETE_MARKER`), and a folder's identity is an object of its own
(`IDENTITY_MARKER`).
"""

import builtins
import fnmatch
import json
import os
import re
import shutil
import tempfile
import uuid
from typing import Any, Callable, Iterator, List, Optional, Tuple

# What every temporary file or folder of an atomic write starts with.
TEMPORARY_PREFIX = ".tmp-"
# Written last into a folder written whole on a URL (an export): a folder
# without it is a write in progress, or one a crash cut short.
COMPLETE_MARKER = ".complete"
# A URL directory's identity: a random token, written when the run takes
# the directory. Gone: the directory was deleted; another token: replaced.
IDENTITY_MARKER = ".identity"

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# A URL with one slash (`gs:/bucket`): the OS would take it for a local
# folder named `gs:`.
_ONE_SLASH = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):/(?!/)")
_LOCAL_SCHEMES = ("file",)
# Schemes TensorFlow 2.20 has no file system for, with what to do instead.
_UNAVAILABLE = {
    "s3": ("TensorFlow 2.20 has no s3:// file system (tensorflow-io's "
           "plugins do not load on it): mount the bucket (s3fs, "
           "mountpoint-s3) and pass the local path, or use gs://"),
}


def scheme(path: str) -> str:
  """The URL scheme of `path` (`gs`, `ram`, ...), "" for a local path."""
  match = _URL.match(path)
  if not match or match.group(1).lower() in _LOCAL_SCHEMES:
    return ""
  return match.group(1).lower()


def is_url(path: str) -> bool:
  """Whether `path` is a URL of a non-local file system (`gs://...`)."""
  return bool(scheme(path))


def _local(path: str) -> str:
  """`path` as the OS takes it: `file://` dropped."""
  match = _URL.match(path)
  return path[len(match.group(0)):] if match else path


def _gfile():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.io.gfile


def _replacing(path: str) -> None:
  """Makes way for a new `path` where the file system would not.

  TensorFlow's in-memory `ram://` file system (the tests' stand-in for a
  bucket) appends to a file opened for writing instead of replacing it
  (measured, TensorFlow 2.20): there the old file is removed first. Object
  stores replace an object whole.
  """
  if scheme(path) == "ram":
    remove(path)


def check_path(path: str, flag: str) -> None:
  """Checks that `path` names a file system this process can use.

  A URL with one slash (`gs:/bucket`) or of a scheme TensorFlow has not
  registered would otherwise be written as a local folder (`./gs:/...`) or
  fail at the first checkpoint.

  Args:
    path: The path given.
    flag: How the user gave it (`--model_dir`), for the error.

  Raises:
    errors.ConfigError: One line naming the problem.
  """
  from trainer import errors  # pylint: disable=g-import-not-at-top
  one_slash = _ONE_SLASH.match(path)
  if one_slash and len(one_slash.group(1)) > 1:  # Not `C:/` on Windows.
    name = one_slash.group(1)
    raise errors.ConfigError(
        f"{flag} ({path}) has one slash after `{name}:`: write "
        f"{name}://{path[len(one_slash.group(0)):]}")
  name = scheme(path)
  if not name:
    return
  if name in _UNAVAILABLE:
    raise errors.ConfigError(f"{flag} ({path}): {_UNAVAILABLE[name]}.")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  try:
    tf.io.gfile.exists(path)
  except tf.errors.UnimplementedError:
    raise errors.ConfigError(
        f"{flag} ({path}): TensorFlow has no file system for `{name}://`; "
        "the schemes that work are a local path, gs:// and ram://.") from None


def absolute(path: str) -> str:
  """`path` made absolute if local (relative to the working directory);
  a URL as it is (`os.path.abspath` would turn `gs://b` into `./gs:/b`)."""
  return path if is_url(path) else os.path.abspath(_local(path))


def same_path(a: str, b: str) -> bool:
  """Whether `a` and `b` name the same place (as strings, made absolute)."""
  if is_url(a) or is_url(b):
    return a.rstrip("/") == b.rstrip("/")
  return os.path.abspath(_local(a)) == os.path.abspath(_local(b))


def exists(path: str) -> bool:
  """Whether a file or directory is at `path`."""
  if is_url(path):
    return _gfile().exists(path)
  return os.path.exists(_local(path))


def isdir(path: str) -> bool:
  """Whether `path` is a directory (on an object store: a prefix with
  objects below it, or a directory object)."""
  if is_url(path):
    return _gfile().isdir(path)
  return os.path.isdir(_local(path))


def isfile(path: str) -> bool:
  """Whether `path` is a file (an object)."""
  if is_url(path):
    return _gfile().exists(path) and not _gfile().isdir(path)
  return os.path.isfile(_local(path))


def listdir(path: str) -> List[str]:
  """The sorted names in directory `path`; [] if it is missing.

  Names never end in `/` (object stores give sub-directories so).
  """
  if is_url(path):
    gfile = _gfile()
    if not gfile.isdir(path):
      return []
    return sorted({name.rstrip("/") for name in gfile.listdir(path)})
  try:
    return sorted(os.listdir(_local(path)))
  except (FileNotFoundError, NotADirectoryError):
    return []


def glob(pattern: str) -> List[str]:
  """The sorted paths matching `pattern` (`*`, `?`, `[...]` in names)."""
  if is_url(pattern):
    return sorted(name.rstrip("/") for name in _gfile().glob(pattern))
  import glob as glob_lib  # pylint: disable=g-import-not-at-top
  return sorted(glob_lib.glob(_local(pattern)))


def matching(directory: str, name_pattern: str) -> List[str]:
  """The sorted paths in `directory` whose name matches `name_pattern`."""
  return [os.path.join(directory, name) for name in listdir(directory)
          if fnmatch.fnmatchcase(name, name_pattern)]


def walk(top: str) -> Iterator[Tuple[str, List[str], List[str]]]:
  """Yields `(directory, sub-directory names, file names)` from `top`
  down, as `os.walk` does."""
  if is_url(top):
    for directory, folders, names in _gfile().walk(top):
      # In place: `gfile.walk` descends into what the caller leaves of it.
      folders[:] = [folder.rstrip("/") for folder in folders]
      yield directory.rstrip("/"), folders, names
    return
  yield from os.walk(_local(top))


def makedirs(path: str) -> None:
  """Makes directory `path` and its missing parents."""
  if is_url(path):
    _gfile().makedirs(path)
  else:
    os.makedirs(_local(path), exist_ok=True)


def _url_removed(remover: Callable[[str], None], path: str) -> bool:
  """Calls `remover(path)` on a URL; returns False if nothing was there."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  try:
    remover(path)
  except tf.errors.NotFoundError:
    return False
  return True


def remove(path: str) -> bool:
  """Removes file `path`; returns whether there was one."""
  if is_url(path):
    return _url_removed(_gfile().remove, path)
  try:
    os.remove(_local(path))
  except FileNotFoundError:
    return False
  return True


def rmtree(path: str) -> None:
  """Removes directory `path` and everything below it, if there."""
  if is_url(path):
    _url_removed(_gfile().rmtree, path)
  else:
    shutil.rmtree(_local(path), ignore_errors=True)


def remove_any(path: str) -> None:
  """Removes `path`, a file or a directory, if there."""
  if isdir(path):
    rmtree(path)
  else:
    remove(path)


def rename(source: str, target: str) -> None:
  """Renames file `source` to `target`, replacing it (atomically where the
  file system renames atomically: local disks, not object stores)."""
  if is_url(source) or is_url(target):
    _gfile().rename(source, target, overwrite=True)
  else:
    os.replace(_local(source), _local(target))


def copy(source: str, target: str) -> None:
  """Copies file `source` to `target`, replacing it; the copy is whole or
  absent (through a temporary file locally; one object on a store)."""
  if is_url(source) or is_url(target):
    _replacing(target)
    _gfile().copy(source, target, overwrite=True)
    return
  directory = os.path.dirname(_local(target)) or "."
  temporary = os.path.join(
      directory, f"{TEMPORARY_PREFIX}{os.path.basename(target)}-"
      f"{uuid.uuid4().hex[:8]}.part")
  try:
    shutil.copyfile(_local(source), temporary)
    os.replace(temporary, _local(target))
  finally:
    if os.path.exists(temporary):
      os.remove(temporary)


def size(path: str) -> int:
  """The size of file `path` in bytes."""
  if is_url(path):
    return _gfile().stat(path).length
  return os.path.getsize(_local(path))


def tree_size(path: str) -> int:
  """The bytes of every file below directory `path`."""
  return sum(size(os.path.join(directory, name))
             for directory, _, names in walk(path) for name in names)


def mtime(path: str) -> float:
  """When file `path` was last written, in seconds since the epoch."""
  if is_url(path):
    return _gfile().stat(path).mtime_nsec / 1e9
  return os.path.getmtime(_local(path))


def open_file(path: str, mode: str = "r"):
  """Opens `path` (`r`, `rb`, `w`, `wb`, `a`): a local file as `open` does
  (text as UTF-8), a URL as `tf.io.gfile.GFile`. Not atomic: prefer
  `write_text` and its kin for what a reader may take half-written."""
  if is_url(path):
    if "w" in mode:
      _replacing(path)
    return _gfile().GFile(path, mode)
  if "b" in mode:
    return builtins.open(_local(path), mode)
  return builtins.open(_local(path), mode, encoding="utf-8", newline="")


def read_bytes(path: str) -> Optional[bytes]:
  """The content of file `path`; None if there is no such file."""
  if is_url(path):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    try:
      with _gfile().GFile(path, "rb") as f:
        return f.read()
    except tf.errors.NotFoundError:
      return None
  try:
    with builtins.open(_local(path), "rb") as f:
      return f.read()
  except FileNotFoundError:
    return None


def read_text(path: str) -> Optional[str]:
  """The UTF-8 text of file `path`; None if there is no such file.

  Raises:
    UnicodeDecodeError: If it is not UTF-8 text.
  """
  data = read_bytes(path)
  return None if data is None else data.decode("utf-8")


def read_json(path: str) -> Optional[Any]:
  """Returns the JSON value in `path`, or None if there is no such file."""
  text = read_text(path)
  return None if text is None else json.loads(text)


def _umask() -> int:
  mask = os.umask(0)  # The only way to read it is to set it.
  os.umask(mask)
  return mask


def write_text(path: str, text: str, root: Optional[str] = None) -> bool:
  """Writes `text` to `path` whole: a reader (or a crash) sees the old
  content or the new.

  Locally through a temporary file and a rename; the file gets the mode an
  `open(path, "w")` would (0644 under umask 022), like the checkpoints
  beside it, not the temporary file's 0600. On an object store as one
  object, which is written whole or not at all.

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
  if is_url(path):
    if directory_gone(root):
      return False
    # Some file systems (`ram://`) list only folders that were made.
    _gfile().makedirs(os.path.dirname(path))
    _replacing(path)
    with _gfile().GFile(path, "wb") as f:
      f.write(data)
    return True
  path = _local(path)
  directory = os.path.dirname(path) or "."
  try:
    _make_below(root and _local(root), directory)
    _write_and_rename(path, directory, data)
  except FileNotFoundError:
    if directory_gone(root):
      return False
    raise
  return True


def append_text(path: str, text: str) -> None:
  """Appends `text` to file `path` (made if missing).

  Locally an append, flushed to disk. On an object store, which cannot
  append, the object is written anew whole (TensorFlow's GCS file system
  does that for mode `a`): the old content or the new, never half a line.
  """
  if is_url(path):
    _gfile().makedirs(os.path.dirname(path))
    with _gfile().GFile(path, "a") as f:
      f.write(text)
    return
  with builtins.open(_local(path), "a", encoding="utf-8", newline="") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())


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


def mark_directory(directory: str) -> None:
  """Gives URL `directory` an identity (`IDENTITY_MARKER`) if it has none;
  local directories have one already (device, inode)."""
  if is_url(directory) and read_bytes(
      os.path.join(directory, IDENTITY_MARKER)) is None:
    write_text(os.path.join(directory, IDENTITY_MARKER), uuid.uuid4().hex)


def directory_identity(directory: str) -> Optional[Any]:
  """What tells `directory` from one made again under the same name:
  `(device, inode)` locally, the `IDENTITY_MARKER` token of a URL
  (`mark_directory`); None if it is missing."""
  if is_url(directory):
    return read_text(os.path.join(directory, IDENTITY_MARKER))
  try:
    status = os.stat(_local(directory))
  except OSError:
    return None
  return (status.st_dev, status.st_ino)


def directory_gone(model_dir: Optional[str]) -> bool:
  """Whether `model_dir` (None: none to watch) is no longer there: deleted
  under the run, which nothing may make again. A URL model_dir is gone when
  its identity marker is (an object store has no empty folders)."""
  if model_dir is None:
    return False
  if is_url(model_dir):
    return directory_identity(model_dir) is None
  return not os.path.isdir(_local(model_dir))


def write_directory(path: str, fill: Callable[[str], None]) -> None:
  """Creates directory `path` whole: a reader never takes it half-written.

  Locally, `fill(tmp)` writes a temporary sibling, which is then renamed to
  `path` (replacing an older `path`); if `fill` fails, the temporary
  directory is removed and `path` is left as it was. On an object store,
  which renames object by object, `fill(path)` writes in place (an older
  `path` removed first) and `COMPLETE_MARKER` is written last: `complete`
  tells a finished folder from one a crash cut short, which the next write
  of it replaces.
  """
  if is_url(path):
    rmtree(path)
    makedirs(os.path.dirname(path))
    fill(path)
    write_text(os.path.join(path, COMPLETE_MARKER), "")
    return
  path = _local(path)
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


def complete(path: str) -> bool:
  """Whether directory `path`, written by `write_directory`, is whole."""
  if is_url(path):
    return exists(os.path.join(path, COMPLETE_MARKER))
  return os.path.isdir(_local(path))


def scratch_directory(prefix: str) -> str:
  """A new local temporary directory (remove it with `rmtree`): for what
  no one else reads, such as a non-chief worker's summaries."""
  return tempfile.mkdtemp(prefix=prefix)
