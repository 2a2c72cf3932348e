"""Exclusive leases on a model_dir, so that two runs never write it at once.

Two trainers on one `model_dir` destroy each other's work silently (each
deletes the other's checkpoints and interrupted saves). A lease is an
exclusive `fcntl.flock` on a file in `model_dir`, one per role:

- `.trainer.lock`, held by a process that trains (`train`,
  `train_and_eval`): checkpoints, `train/`, `operative_config.gin`,
  `export/`;
- `.evaluator.lock`, held by a process that writes evaluation records
  (`best/`, `early_stopping.json`, `eval/evaluated.json`).

So one trainer and one evaluator may share a `model_dir` (a `train` run
beside a `continuous_eval` one), never two of the same role. The file holds
the holder's host, pid, start time, mode and command, named in the error a
second run gets. The kernel drops a flock when its process dies, however it
dies: a crashed holder's file stays, but blocks no one, and the next holder
overwrites it. A holder that ends normally removes its file.

A lease needs a filesystem whose flock every process that may write shares:
local disks, and NFS unless mounted `nolock` or `local_lock` (Linux clients
pass flock to the server). Filesystems that refuse flock get no lease; a
warning says so.

An object store (`gs://`) has no lock that `tf.io.gfile` can take: a sound
lease there needs a create-if-absent precondition (GCS's
`ifGenerationMatch=0`), which TensorFlow's file system does not expose. So a
URL model_dir gets a lease object instead: each holder writes its record,
with a random token, to the same `.<role>.lock` object, replacing any other;
`verify` (at every checkpoint save) reads it back, and a holder whose token
was replaced stops there, naming the newer holder. Two runs on one bucket
path are so detected at the earlier one's next save, not refused at the
start; a warning at the start names a record left by another holder.
"""

import datetime
import errno
import fcntl
import json
import os
import socket
import sys
import time
import uuid
from typing import Callable, Dict, List, Optional, Sequence

from trainer import console
from trainer import errors
from trainer.storage import files

TRAINER = "trainer"
EVALUATOR = "evaluator"
ROLES = (TRAINER, EVALUATOR)
_WRITES = {TRAINER: "writing checkpoints",
           EVALUATOR: "writing evaluation records"}
# flock errors meaning the filesystem cannot lock (not that someone holds it).
_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)
# The object leases this process holds: directory -> {role: token}.
_OBJECT_LEASES: Dict[str, Dict[str, str]] = {}


def lock_path(directory: str, role: str) -> str:
  """Returns the lease file of `role` in `directory`."""
  return os.path.join(directory, f".{role}.lock")


def in_use_message(holder: Optional[Dict[str, object]], role: str) -> str:
  """Returns the error line naming the lease's `holder` (None: unknown)."""
  who = _holder(holder, _WRITES[role]) if holder else "another process"
  return (f"model_dir is in use by {who}; stop it first, or use another "
          "--model_dir.")


class Lease:
  """The leases of some roles on a directory, held until `release`.

  Use as a context manager: `with Lease(model_dir, [TRAINER], "train"):`.
  """

  def __init__(self, directory: str, roles: Sequence[str], mode: str,
               warn: Callable[[str], None] = console.warning):
    """Describes the leases; takes none yet.

    Args:
      directory: The model_dir; it must exist.
      roles: Some of `ROLES`, taken in this order.
      mode: What the holder runs, for the error a second run gets.
      warn: Called with one line when `directory` cannot be leased (by
        default `console.warning`: `warning | <line>` on stdout).
    """
    for role in roles:
      if role not in ROLES:
        # A programming error, not the user's: the roles come from
        # `model_dir.lease_roles`, never from a setting.
        raise ValueError(f"`role` ({role!r}) must be one of {ROLES}.")
    self.directory = directory
    self.roles = tuple(roles)
    self.mode = mode
    self._warn = warn
    self._held: Dict[str, int] = {}  # Role -> locked file descriptor.
    self._tokens: Dict[str, str] = {}  # Role -> its lease object's token.

  @property
  def held(self) -> List[str]:
    """The roles whose lease this object holds (on a URL: whose lease
    object it wrote)."""
    return list(self._held) + list(self._tokens)

  def acquire(self) -> None:
    """Takes every role's lease, or none.

    Raises:
      errors.ConfigError: If another process holds one of them; its line
        names the holder.
    """
    if not self.roles:
      return
    if files.is_url(self.directory):
      self._take_objects()
      return
    try:
      for role in self.roles:
        fd = self._lock(role)
        if fd is None:
          return
        self._held[role] = fd
    except BaseException:
      self.release()
      raise

  def _lock(self, role: str) -> Optional[int]:
    """Returns the descriptor holding `role`'s lease, None if unsupported."""
    path = lock_path(self.directory, role)
    # A holder that ends unlinks its file before unlocking it: one locked
    # after that is no longer the lease file; open the new one and retry.
    for _ in range(10):
      flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
      fd = os.open(path, flags, 0o644)  # local-path: URLs take no flock
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except OSError as e:
        if e.errno in _UNSUPPORTED:
          os.close(fd)
          self._warn(f"{self.directory}: the filesystem does not support "
                     f"locks ({e.strerror}): no lease keeps a second run from "
                     "writing it at the same time; make sure only one does.")
          return None
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
          os.close(fd)
          raise
        if _is_file_at(fd, path):
          holder = _read_holder(fd)
          os.close(fd)
          raise errors.ConfigError(in_use_message(holder, role)) from None
        os.close(fd)
        continue
      if _is_file_at(fd, path):
        _write_holder(fd, self.mode)
        return fd
      os.close(fd)
    raise errors.ConfigError(in_use_message(None, role))

  def _take_objects(self) -> None:
    """Writes this holder's record into each role's lease object."""
    for role in self.roles:
      path = lock_path(self.directory, role)
      left = _read_object(path)
      if left:
        self._warn(
            f"{self.directory}: {_holder(left)} left its {role} lease "
            "there: it was killed, or it still runs. An object store gives "
            "no lock: if it runs, the earlier of the two stops at its next "
            "checkpoint save.")
      self._tokens[role] = uuid.uuid4().hex
      files.write_json(path, dict(_holder_record(self.mode),
                                  token=self._tokens[role]))
    _OBJECT_LEASES[self.directory] = self._tokens

  def release(self) -> None:
    """Gives back every lease held; safe to call more than once."""
    if _OBJECT_LEASES.get(self.directory) is self._tokens:
      del _OBJECT_LEASES[self.directory]
    for role, token in self._tokens.items():
      path = lock_path(self.directory, role)
      held = _read_object(path)
      if held and held.get("token") == token:  # Not a newer holder's.
        files.remove(path)
    self._tokens = {}
    for role, fd in reversed(list(self._held.items())):
      path = lock_path(self.directory, role)
      # Unlinked before the unlock, so no one locks a removed file unaware;
      # not if someone replaced it (it would be another holder's).
      if _is_file_at(fd, path):
        try:
          os.unlink(path)  # local-path: a flock file
        except OSError:
          pass
      os.close(fd)
    self._held.clear()

  def __enter__(self) -> "Lease":
    self.acquire()
    return self

  def __exit__(self, *exc_info) -> None:
    self.release()


def _is_file_at(fd: int, path: str) -> bool:
  """Whether `fd` is (still) the file at `path`."""
  try:
    found = os.stat(path)  # local-path: a flock file
  except FileNotFoundError:
    return False
  opened = os.fstat(fd)
  return (found.st_dev, found.st_ino) == (opened.st_dev, opened.st_ino)


def verify(directory: str) -> None:
  """Checks that the object leases this process took on `directory` are
  still its own (a local lease cannot be taken from its holder).

  Raises:
    errors.RunError: If another run replaced one: both were writing it.
  """
  for role, token in _OBJECT_LEASES.get(directory, {}).items():
    held = _read_object(lock_path(directory, role))
    if held is not None and held.get("token") != token:
      raise errors.RunError(
          f"model_dir {directory} was taken by {_holder(held)}: two runs "
          "were writing it. This one stops here; its checkpoints so far "
          "are kept. Stop the other, or give each its own --model_dir.")


def object_holder(directory: str, role: str) -> Optional[Dict[str, object]]:
  """The record in URL `directory`'s lease object of `role` (host, pid,
  since, mode); None if there is none: no holder, or one that ended."""
  return _read_object(lock_path(directory, role))


def _read_object(path: str) -> Optional[Dict[str, object]]:
  """The holder record in lease object `path`; None if none is there."""
  try:
    holder = files.read_json(path)
  except ValueError:  # Not a record of ours.
    return None
  return holder if isinstance(holder, dict) else None


def _holder(holder: Dict[str, object], doing: Optional[str] = None) -> str:
  """Names the holder of a record: pid, host, since when, what it runs."""
  what = ", ".join(str(part) for part in (holder.get("mode"), doing) if part)
  return (f"pid {holder.get('pid')} on host {holder.get('host')} since "
          f"{holder.get('since')} ({what})")


def _holder_record(mode: str) -> Dict[str, object]:
  since = datetime.datetime.now().astimezone().isoformat(
      sep=" ", timespec="seconds")
  return {"host": socket.gethostname(), "pid": os.getpid(), "since": since,
          "mode": mode, "command": " ".join(sys.argv)}


def _write_holder(fd: int, mode: str) -> None:
  holder = _holder_record(mode)
  os.ftruncate(fd, 0)
  os.pwrite(fd, (json.dumps(holder) + "\n").encode("utf-8"), 0)


def _read_holder(fd: int) -> Optional[Dict[str, object]]:
  """Reads the holder's record, waiting a little for a new holder's write."""
  for _ in range(20):
    try:
      holder = json.loads(os.pread(fd, 1 << 16, 0).decode("utf-8"))
      if isinstance(holder, dict):
        return holder
    except ValueError:
      pass
    time.sleep(0.05)
  return None
