"""Optuna's journal file, kept whole: nothing is ever appended after a bad
record.

The journal is one JSON record a line, appended under Optuna's lock. A
full disk or a crash mid-write leaves a torn last line, and a stray write
can leave a garbage one. Optuna reads past such a tail, but appends after
it: the next record then shares a line with the torn one, and from the
record after that every read fails with `JSONDecodeError`. So here:

- a read stops at the first bad record, so the study read is always the
  state after some whole record (`Storage.damage` says when one was met);
- an append first checks, under the lock, that the file ends with a whole
  record, and cuts a bad tail back (`repair`) before it writes; a write
  that fails (a full disk) is cut back, so it leaves no torn record;
- `repair` keeps the damaged file aside (`study.journal.damaged-<n>`) and
  says in one line what it dropped.

The journal needs a local file system (it appends, and takes file locks),
so every path here is local: a URL sweep directory's journal (`gs://...`)
is kept in a local folder (`warm.local_dir`) and copied whole to
`<sweep_dir>/study.journal` as each trial starts and ends (`save`); on a
machine without the local copy, or with an older one, the URL's is brought
back first (`restore`), so a sweep continues wherever it is rerun.
"""

import contextlib
import json
import os
from typing import Any, Dict, Generator, Iterator, Optional, Tuple

import optuna
from optuna.storages import journal as optuna_journal

from trainer import console
from trainer import errors
from trainer.storage import files
from trainer.sweeps import warm

DAMAGED = ".damaged-"
# The tail read back to find the last record (records are a few hundred
# bytes; a longer one is read whole).
_TAIL_BYTES = 1 << 16


def _whole(line: bytes) -> bool:
  """Whether `line` is a whole record: a JSON object and its newline."""
  if not line.endswith(b"\n"):
    return False
  try:
    return isinstance(json.loads(line), dict)
  except ValueError:  # JSONDecodeError, or bytes that are not UTF-8.
    return False


def scan(path: str) -> Tuple[int, int, int]:
  """Returns the whole records from the start of `path`, the bytes they
  take, and the file's size: the two sizes differ when its tail is bad."""
  records = good = 0
  with open(path, "rb") as f:  # local-path: the journal is local
    size = os.fstat(f.fileno()).st_size
    for line in f:
      if not _whole(line):
        break
      records += 1
      good += len(line)
  return records, good, size


def _last_line_whole(path: str) -> bool:
  """Whether `path` is empty or ends with a whole record (read from its
  end: an append checks this, not the whole file)."""
  with open(path, "rb") as f:  # local-path: the journal is local
    size = os.fstat(f.fileno()).st_size
    if size == 0:
      return True
    back = min(size, _TAIL_BYTES)
    while True:
      f.seek(size - back)
      tail = f.read(back)
      start = tail.rfind(b"\n", 0, len(tail) - 1)
      if start >= 0 or back == size:
        return _whole(tail[start + 1:])
      back = min(size, back * 2)


def _aside(path: str) -> str:
  number = 1
  while files.exists(f"{path}{DAMAGED}{number}"):
    number += 1
  return f"{path}{DAMAGED}{number}"


def _cut(path: str) -> Optional[str]:
  """Cuts `path` back to its last whole record, keeping the damaged file
  aside; returns the line saying so, or None if it was whole. The caller
  holds the journal's lock (so no write is in progress)."""
  records, good, size = scan(path)
  if good == size:
    return None
  damaged = files.read_bytes(path)
  aside = _aside(path)
  files.write_bytes(aside, damaged)
  dropped = damaged[good:].count(b"\n") + (not damaged.endswith(b"\n"))
  os.truncate(path, good)  # local-path: the journal is local
  return (f"sweep | {path}: dropped {size - good} bytes after record "
          f"{records} ({dropped} line{'s' if dropped != 1 else ''} not "
          f"whole or after one); the damaged file is kept as {aside}")


def _lock(path: str) -> optuna_journal.JournalFileSymlinkLock:
  # Optuna's default lock for the file, which every append takes.
  return optuna_journal.JournalFileSymlinkLock(path)


@contextlib.contextmanager
def _held(lock: optuna_journal.JournalFileSymlinkLock) -> Iterator[None]:
  lock.acquire()
  try:
    yield
  finally:
    lock.release()


def repair(path: str) -> Optional[str]:
  """Cuts a bad tail of the journal `path` back to its last whole record,
  under the journal's lock; says so in one line (also returned).

  Raises:
    OSError: The file cannot be written (a read-only or full disk).
  """
  if not files.exists(path):
    return None
  _, good, size = scan(path)
  if good == size:
    return None
  # Scanned again under the lock: a last line found short may have been
  # one another process was writing, whole by now.
  with _held(_lock(path)):
    said = _cut(path)
  if said:
    console.info(said)
  return said


class Backend(optuna_journal.JournalFileBackend):
  """Optuna's `JournalFileBackend`, reading only up to a bad record and
  never appending after one.

  Attributes:
    damage: Where the last read stopped at a bad record (`record N (byte
      B)`), or None. A record being written reads as one too.
  """

  def __init__(self, file_path: str):
    super().__init__(file_path, _lock(file_path))
    self.damage: Optional[str] = None
    self._offsets: Dict[int, int] = {0: 0}

  def read_logs(self, log_number_from: int
                ) -> Generator[Dict[str, Any], None, None]:
    self.damage = None
    with open(self._file_path, "rb") as f:  # local-path: the journal
      # Lines appended while this reads are left to the next read.
      size = os.fstat(f.fileno()).st_size
      number = log_number_from if log_number_from in self._offsets else 0
      offset = self._offsets[number]
      f.seek(offset)
      for line in f:
        if offset + len(line) > size:
          return  # Written since this read began.
        try:
          record = json.loads(line) if line.endswith(b"\n") else None
        except ValueError:
          record = None
        if not isinstance(record, dict):
          # Garbage, or a torn record; or, with no newline yet, one being
          # written: a reader cannot tell, and looks again to see.
          self.damage = f"record {number + 1} (byte {offset})"
          return
        offset += len(line)
        number += 1
        self._offsets[number] = offset
        if number > log_number_from:
          yield record

  def append_logs(self, logs) -> None:
    data = "".join(json.dumps(log, separators=(",", ":")) + "\n"
                   for log in logs).encode("utf-8")
    with _held(self._lock):
      # Under the lock no write is in progress: a tail that is not a whole
      # record is damage, and a record written after it would be lost.
      if not _last_line_whole(self._file_path):
        said = _cut(self._file_path)
        if said:
          console.info(said)
      fd = os.open(  # local-path: the journal is local
          self._file_path, os.O_WRONLY | os.O_APPEND)
      try:
        start = os.fstat(fd).st_size
        try:
          written = 0
          while written < len(data):
            written += os.write(fd, data[written:])
          os.fsync(fd)  # local-path: the journal is local
        except OSError as e:
          # A full disk: no torn record is left for the next append.
          os.ftruncate(fd, start)
          raise OSError(e.errno, e.strerror, self._file_path) from e
      finally:
        os.close(fd)


class Storage(optuna.storages.JournalStorage):
  """Optuna's journal storage on `Backend`, for the file `path`."""

  def __init__(self, path: str):
    self._file = Backend(path)
    super().__init__(self._file)

  @property
  def damage(self) -> Optional[str]:
    """Where the last read of the file stopped at a bad record (or one
    being written), or None: the study read is then the state before it,
    not all of it."""
    return self._file.damage


def path(sweep_dir: str) -> str:
  """The journal of the sweep in `sweep_dir`: in it, or for a URL in its
  local folder (`warm.local_dir`)."""
  return os.path.join(warm.local_dir(sweep_dir), warm.JOURNAL)


def url_copy(sweep_dir: str) -> Optional[str]:
  """The copy of a URL sweep directory's journal at the URL (`save`);
  None for a local sweep directory, whose journal is the file itself."""
  if not files.is_url(sweep_dir):
    return None
  return os.path.join(sweep_dir, warm.JOURNAL)


def restore(sweep_dir: str) -> None:
  """Brings a URL sweep directory's journal to its local folder where that
  has less of it: none (a new machine), or an older copy (the sweep went on
  on another machine). A local copy that goes further (records written
  since the last `save`, which a kill cut short) is kept.

  Raises:
    errors.ConfigError: The two went separate ways (two machines swept the
      URL at once).
  """
  remote = url_copy(sweep_dir)
  theirs = remote and files.read_bytes(remote)
  if not theirs:
    return
  local = path(sweep_dir)
  ours = files.read_bytes(local) or b""
  if ours.startswith(theirs):
    return
  if not theirs.startswith(ours):
    raise errors.ConfigError(
        f"the journal of {sweep_dir} and this machine's copy ({local}) went "
        "separate ways (two machines swept it at once?): move the copy away "
        "to continue from the URL's.")
  # Under the journal's lock: no append of this machine is in progress.
  files.makedirs(os.path.dirname(local))
  with _held(_lock(local)):
    files.write_bytes(local, theirs)


def save(sweep_dir: str) -> None:
  """Copies a URL sweep directory's local journal to the URL, whole (one
  object); nothing for a local one, or one without a journal (`--storage`).
  A copy that fails is said in one line: the sweep goes on, and the next
  copies the whole journal.
  """
  remote = url_copy(sweep_dir)
  local = path(sweep_dir)
  if remote is None or not files.exists(local):
    return
  with _held(_lock(local)):  # A whole copy: no append in progress.
    data = files.read_bytes(local)
  try:
    files.write_bytes(remote, data)
  except Exception as e:  # pylint: disable=broad-except
    # The store out of reach a while (TensorFlow's errors, not OSError).
    console.warning(f"sweep | {remote} not copied ({type(e).__name__}: "
                    f"{str(e).splitlines()[0] if str(e) else ''}); the "
                    f"journal is whole in {local}, copied again after the "
                    "next trial")
