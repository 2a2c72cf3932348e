"""File locks that decide which sweep process runs which trial.

A sweep process holds `trial-<n>/.sweep.lock` (an exclusive `fcntl.flock`)
for as long as it owns trial n, from Optuna's `ask` to its `tell`. The
kernel drops a flock when its process dies, however it dies, so a trial
left RUNNING in the study whose lock is free belongs to a dead process and
may be taken over, with its number, bindings and model_dir. The same flock
as `train.py`'s lease (trainer/storage/lease.py), with the same reach:
local disks, and NFS unless mounted `nolock` or `local_lock`. Optuna's own
heartbeat covers RDB storage only, not the journal file.
"""

import contextlib
import errno
import fcntl
import os
import time
from typing import Iterator, Optional

from trainer.storage import lease

CLAIMS = ".claims.lock"
TRIAL = ".sweep.lock"


def try_lock(path: str) -> Optional[int]:
  """Takes the exclusive lock on `path` (created if missing) without
  waiting; returns its file descriptor, or None if another holds it."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError as e:
    os.close(fd)
    if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
      return None
    raise
  return fd


def release(fd: int) -> None:
  """Releases a lock `try_lock` took."""
  fcntl.flock(fd, fcntl.LOCK_UN)
  os.close(fd)


@contextlib.contextmanager
def held(path: str) -> Iterator[None]:
  """Holds the exclusive lock on `path` for the block, waiting for it.

  Each call opens the file anew, so threads of one process exclude each
  other too (a flock belongs to an open file, not a process).
  """
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX)
    yield
  finally:
    os.close(fd)


def wait_for_trainer(model_dir: str, timeout: float,
                     poll_seconds: float = 0.5) -> bool:
  """Waits until no process holds `model_dir`'s trainer lease (a killed
  sweep's trial may still be saving its checkpoint); returns whether it
  became free within `timeout` seconds."""
  path = lease.lock_path(model_dir, lease.TRAINER)
  deadline = time.monotonic() + timeout
  while os.path.exists(path):
    fd = try_lock(path)
    if fd is not None:
      release(fd)
      return True
    if time.monotonic() > deadline:
      return False
    time.sleep(poll_seconds)
  return True
