"""File locks that decide which sweep process runs which trial.

A sweep process holds `trial-<n>/.sweep.lock` (an exclusive `fcntl.flock`)
for as long as it owns trial n, from Optuna's `ask` to its `tell`. The
kernel drops a flock when its process dies, however it dies, so a trial
left RUNNING in the study whose lock is free belongs to a dead process and
may be taken over, with its number, bindings and model_dir. The same flock
as `train.py`'s lease (trainer/storage/lease.py), with the same reach:
local disks, and NFS unless mounted `nolock` or `local_lock`. Optuna's own
heartbeat covers RDB storage only, not the journal file.

A flock needs a local file system: a URL sweep directory's locks (`gs://`)
are in its local folder (`warm.local_dir`), beside its journal's copy, so
one process may sweep it (`alone`), its trials run by `--parallel` threads.
"""

import contextlib
import errno
import fcntl
import os
import socket
import threading
import time
import uuid
from typing import Any, Dict, Iterator, Optional

from trainer import console
from trainer import errors
from trainer.storage import files
from trainer.storage import lease
from trainer.sweeps import warm

CLAIMS = ".claims.lock"
TRIAL = ".sweep.lock"
# In a URL sweep directory's local folder: held by the one process that
# sweeps it from this machine.
WORKER = ".worker.lock"
# In a URL sweep directory: the process sweeping it, and when it last said
# so (every `HEARTBEAT_SECONDS`); older than `STALE_SECONDS`, it is dead.
OWNER = ".sweep.worker"
HEARTBEAT_SECONDS = 30.0
STALE_SECONDS = 120.0


def try_lock(path: str) -> Optional[int]:
  """Takes the exclusive lock on `path` (created if missing) without
  waiting; returns its file descriptor, or None if another holds it."""
  files.makedirs(os.path.dirname(path))
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # local-path: a flock
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
  files.makedirs(os.path.dirname(path))
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # local-path: a flock
  try:
    fcntl.flock(fd, fcntl.LOCK_EX)
    yield
  finally:
    os.close(fd)


def wait_for_trainer(model_dir: str, timeout: float,
                     poll_seconds: float = 0.5) -> bool:
  """Waits until no process holds `model_dir`'s trainer lease (a killed
  sweep's trial may still be saving its checkpoint); returns whether it
  became free within `timeout` seconds.

  A URL `model_dir`'s lease is an object (`trainer.storage.lease`): it is
  waited for while it names a process of this host that still runs. One it
  names elsewhere cannot be asked: not waited for (if it still runs, the
  earlier of the two trials stops at its next checkpoint save).
  """
  deadline = time.monotonic() + timeout
  if files.is_url(model_dir):
    while True:
      holder = lease.object_holder(model_dir, lease.TRAINER)
      if (not holder or holder.get("host") != socket.gethostname() or
          not _running_here(holder)):
        return True
      if time.monotonic() > deadline:
        return False
      time.sleep(poll_seconds)
  path = lease.lock_path(model_dir, lease.TRAINER)
  while files.exists(path):
    fd = try_lock(path)
    if fd is not None:
      release(fd)
      return True
    if time.monotonic() > deadline:
      return False
    time.sleep(poll_seconds)
  return True


def claims(sweep_dir: str) -> str:
  """The sweep's claims lock (in its local folder, `warm.local_dir`)."""
  return os.path.join(warm.local_dir(sweep_dir), CLAIMS)


def trial(sweep_dir: str, name: str) -> str:
  """The lock of the trial whose model_dir is `sweep_dir/name` (in the
  sweep's local folder, `warm.local_dir`)."""
  return os.path.join(warm.local_dir(sweep_dir), name, TRIAL)


def _refusal(sweep_dir: str, who: str) -> errors.ConfigError:
  return errors.ConfigError(
      f"--sweep_dir={sweep_dir} is swept by {who}: sweep processes cannot "
      "share a URL --sweep_dir (each keeps its journal and locks on its own "
      "machine); for several workers give a --sweep_dir on a shared file "
      "system (NFS) that every worker mounts.")


@contextlib.contextmanager
def alone(sweep_dir: str, heartbeat_seconds: float = HEARTBEAT_SECONDS,
          stale_seconds: float = STALE_SECONDS) -> Iterator[None]:
  """Holds a URL sweep directory for this process alone, for the block;
  nothing for a local one, which any number of processes share.

  On this machine a flock in its local folder says so; to other machines,
  `OWNER` in the URL, rewritten every `heartbeat_seconds` and removed at
  the end: one older than `stale_seconds` is a dead process's (SIGKILL),
  whose sweep this one continues.

  Raises:
    errors.ConfigError: Another process sweeps it.
  """
  if not files.is_url(sweep_dir):
    yield
    return
  fd = try_lock(os.path.join(warm.local_dir(sweep_dir), WORKER))
  if fd is None:
    raise _refusal(sweep_dir, "another process on this machine")
  owner = os.path.join(sweep_dir, OWNER)
  stop = threading.Event()
  beats = None
  try:
    _wait_until_gone(owner, sweep_dir, heartbeat_seconds, stale_seconds)
    record = {"host": socket.gethostname(), "pid": os.getpid(),
              "token": uuid.uuid4().hex}

    def beat():
      files.write_json(owner, dict(record, beat=time.time()))

    def keep_beating():
      while not stop.wait(heartbeat_seconds):
        try:
          beat()
        except Exception as e:  # pylint: disable=broad-except
          # The store is out of reach a while: the next beat may do.
          console.warning(f"sweep | {owner} not rewritten: {e}")

    beat()
    beats = threading.Thread(target=keep_beating, name="sweep-owner",
                             daemon=True)
    beats.start()
    yield
  finally:
    stop.set()
    if beats is not None:
      beats.join()
      # Unless another process took it over, taking this one for dead.
      if (_owner(owner) or {}).get("token") == record["token"]:
        files.remove(owner)
    release(fd)


def _running_here(found: Dict[str, Any]) -> bool:
  """Whether the process `found` names runs on this host (False: it ran
  here and is gone)."""
  try:
    os.kill(int(found.get("pid")), 0)
  except ProcessLookupError:
    return False
  except (OSError, TypeError, ValueError):
    pass  # Another user's process (EPERM), or no pid: taken as running.
  return True


def _wait_until_gone(owner: str, sweep_dir: str, heartbeat_seconds: float,
                     stale_seconds: float) -> None:
  """Returns once no live process holds `owner`.

  A holder on this host that is no longer running is gone at once. One on
  another host cannot be asked: it is gone when its heartbeat is
  `stale_seconds` old, so a sweep rescheduled after a SIGKILL (another
  pod) waits out what is left of that, saying so, rather than refusing.

  Raises:
    errors.ConfigError: The holder beat again: it is alive.
  """
  found = _owner(owner)
  if not found:
    return
  if found.get("host") == socket.gethostname() and not _running_here(found):
    console.info(f"sweep | {owner}: pid {found.get('pid')} of this host "
                 "is gone: this process continues its sweep")
    return
  beat = found.get("beat", 0)
  age = time.time() - beat
  if age >= stale_seconds:
    return
  console.info(
      f"sweep | {owner}: pid {found.get('pid')} on host {found.get('host')} "
      f"was seen {age:.0f} s ago; waiting up to {stale_seconds - age:.0f} s "
      "for its next heartbeat (none: it is gone and this process continues "
      "its sweep)")
  while time.time() - beat < stale_seconds:
    time.sleep(min(heartbeat_seconds, 5.0,
                   max(0.0, stale_seconds - (time.time() - beat))))
    now = _owner(owner)
    if now and now.get("beat") != beat:
      raise _refusal(sweep_dir, (
          f"pid {now.get('pid')} on host {now.get('host')} (its heartbeat "
          f"came {max(0.0, time.time() - now.get('beat', 0)):.0f} s ago)"))
    if not now:
      return  # It ended and removed its record.


def _owner(path: str) -> Optional[Dict[str, Any]]:
  """The process that `OWNER` at `path` names; None if there is none."""
  try:
    return files.read_json(path)
  except ValueError:  # Not whole: no live owner wrote it.
    return None
