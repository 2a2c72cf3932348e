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
pass flock to the server). Paths with a URL scheme (`gs://`, `s3://`) get no
lease, nor do filesystems that refuse flock; a warning says so.
"""

import datetime
import errno
import fcntl
import json
import os
import re
import socket
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence

from trainer import console
from trainer import errors

TRAINER = "trainer"
EVALUATOR = "evaluator"
ROLES = (TRAINER, EVALUATOR)
_WRITES = {TRAINER: "writing checkpoints",
           EVALUATOR: "writing evaluation records"}
# flock errors meaning the filesystem cannot lock (not that someone holds it).
_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def lock_path(directory: str, role: str) -> str:
  """Returns the lease file of `role` in `directory`."""
  return os.path.join(directory, f".{role}.lock")


def in_use_message(holder: Optional[Dict[str, object]], role: str) -> str:
  """Returns the error line naming the lease's `holder` (None: unknown)."""
  if not holder:
    who = "another process"
  else:
    who = (f"pid {holder.get('pid')} on host {holder.get('host')} since "
           f"{holder.get('since')} ({holder.get('mode')}, {_WRITES[role]})")
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

  @property
  def held(self) -> List[str]:
    """The roles whose lease this object holds."""
    return list(self._held)

  def acquire(self) -> None:
    """Takes every role's lease, or none.

    Raises:
      errors.ConfigError: If another process holds one of them; its line
        names the holder.
    """
    if not self.roles:
      return
    if _URL.match(self.directory):
      self._warn(f"{self.directory} is not a local path: no lease keeps a "
                 "second run from writing it at the same time; make sure "
                 "only one does.")
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
      fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
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

  def release(self) -> None:
    """Gives back every lease held; safe to call more than once."""
    for role, fd in reversed(list(self._held.items())):
      path = lock_path(self.directory, role)
      # Unlinked before the unlock, so no one locks a removed file unaware;
      # not if someone replaced it (it would be another holder's).
      if _is_file_at(fd, path):
        try:
          os.unlink(path)
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
    found = os.stat(path)
  except FileNotFoundError:
    return False
  opened = os.fstat(fd)
  return (found.st_dev, found.st_ino) == (opened.st_dev, opened.st_ino)


def _write_holder(fd: int, mode: str) -> None:
  since = datetime.datetime.now().astimezone().isoformat(
      sep=" ", timespec="seconds")
  holder = {"host": socket.gethostname(), "pid": os.getpid(), "since": since,
            "mode": mode, "command": " ".join(sys.argv)}
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
