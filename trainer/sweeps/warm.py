"""Python processes that load TensorFlow before they are told what to run.

Every `train.py` a sweep starts (a new sweep's dry run, each trial) spends
its first seconds importing TensorFlow, as the sweep itself does. So the
sweep starts them ahead: `scripts/sweep.py` starts one for the dry run
before its own imports, the sweep one for the first trial once the bindings
are checked, and each worker the process of its next trial as its trial
starts. The command follows once it is known: the imports run while other
work does, on the host's other cores. Each runs `prelude.py`. Standard
library only, so that starting one costs nothing.
"""

import atexit
import hashlib
import json
import os
import re
import subprocess
import sys
import threading
from typing import List, Optional, Sequence

from trainer.storage import files  # The standard library only.

_HERE = os.path.dirname(
    os.path.abspath(__file__))  # local-path: this source file's folder
REPO_ROOT = os.path.dirname(os.path.dirname(_HERE))

# The program each process runs (a script: the standard library only until
# it imports the framework).
_PRELUDE = os.path.join(_HERE, "prelude.py")

# The study's journal file in the sweep directory (`study.JOURNAL`; this
# module loads before Optuna).
JOURNAL = "study.journal"
# A URL's characters that are no part of a folder's name.
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")

# Flags after which the sweep starts no train.py of its own ahead (under a
# launcher, the launcher starts them).
_NONE_AHEAD = ("--report", "--help", "-h", "--helpfull", "--launcher")


class WarmPython:
  """A Python process with TensorFlow loaded (or loading), waiting for a
  command; killed at exit unless it was given one.

  Args:
    trial: For a trial: its output goes to the log its command names, and
      it dies with the sweep thread that started it (on Linux). Else (the
      dry run) its output is a pipe.
  """

  def __init__(self, trial: bool = False):
    self._given = False
    parent = os.getpid() if trial and sys.platform.startswith("linux") else 0
    self._process = subprocess.Popen(
        [sys.executable, _PRELUDE, REPO_ROOT, str(parent)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL if trial else subprocess.PIPE,
        stderr=subprocess.DEVNULL if trial else subprocess.STDOUT,
        text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    atexit.register(self.close)

  @property
  def alive(self) -> bool:
    """Whether it waits for a command (it did not die loading)."""
    return not self._given and self._process.poll() is None

  def run(self, argv: Sequence[str], log: Optional[str] = None
          ) -> subprocess.Popen:
    """Runs `argv` (`[script, arg, ...]`) in the process, its output
    appended to `log` if given (else the pipe); returns the process."""
    self._given = True
    self._process.stdin.write(json.dumps({"argv": list(argv), "log": log}) +
                              "\n")
    self._process.stdin.close()
    self._process.stdin = None  # So that `communicate` reads only.
    return self._process

  def close(self) -> None:
    """Ends the process if it was never given a command."""
    if not self._given and self._process.poll() is None:
      self._process.kill()
      self._process.communicate()
      self._given = True  # Closed: once is enough.


class Ahead:
  """The processes started ahead of the sweep's own: the dry run's, at
  once (`scripts/sweep.py`), and the first trial's, once the bindings are
  checked (`first_trial`): bad input then starts one process, not two.

  Args:
    new_sweep: Whether the sweep may be new. Only a new sweep has a dry
      run; one that already has its study starts no process for it.
  """

  def __init__(self, new_sweep: bool = True):
    self.dry_run: Optional[WarmPython] = WarmPython() if new_sweep else None
    self.trials = Spares()

  def first_trial(self) -> None:
    """Starts the first trial's process (from the main thread, which
    outlives every worker)."""
    self.trials.add(WarmPython(trial=True))

  def close(self) -> None:
    """Ends every process not given a command."""
    if self.dry_run is not None:
      self.dry_run.close()
    self.trials.close()


class Spares:
  """The next trial's process of each worker thread, started as the
  thread's trial starts.

  A process dies with the thread that started it (`WarmPython`), so a
  thread runs only those it started, or those `add`ed, which the main
  thread started and outlives every worker.
  """

  def __init__(self):
    self._shared: List[WarmPython] = []
    self._lock = threading.Lock()
    self._local = threading.local()

  def add(self, python: WarmPython) -> None:
    """Adds a process any thread may take: one the main thread started."""
    with self._lock:
      self._shared.append(python)

  def take(self, more: bool) -> Optional[WarmPython]:
    """Returns a process for this thread's trial (None: start one cold),
    and starts this thread's next if `more` trials may follow."""
    python = getattr(self._local, "spare", None)
    if python is None:
      with self._lock:
        python = self._shared.pop() if self._shared else None
    self._local.spare = WarmPython(trial=True) if more else None
    if python is not None and not python.alive:
      python.close()
      return None
    return python

  def close(self) -> None:
    """Ends every process not given a command (atexit does too)."""
    with self._lock:
      for python in self._shared:
        python.close()
      self._shared = []


def start(argv: List[str]) -> Optional[Ahead]:
  """Starts the processes ahead, unless `argv` (the sweep's) asks for none
  (`--report`, `--help`) or runs its trials under a `--launcher` (one set
  another way, in a flag file, is `sweeps.cli.main`'s to catch)."""
  if any(arg.split("=", 1)[0] in _NONE_AHEAD for arg in argv[1:]):
    return None
  return Ahead(new_sweep=not _has_journal(argv))


def _has_journal(argv: List[str]) -> bool:
  """Whether `argv`'s `--sweep_dir` holds a journal already (the default
  storage, no `--storage`): a rerun, or a worker joining, whose study has
  had its dry run. Read from the command line as written (`--name=value`
  or `--name value`); a sweep it cannot tell about counts as new."""
  values = {}
  for arg, following in zip(argv[1:], argv[2:] + [""]):
    name, equals, value = arg.partition("=")
    if name in ("--sweep_dir", "--storage"):
      values[name] = value if equals else following
  if "--storage" in values or not values.get("--sweep_dir"):
    return False
  # A URL sweep's local copy (`local_dir`): the URL's is read by the sweep,
  # once TensorFlow has loaded.
  path = os.path.join(local_dir(values["--sweep_dir"]), JOURNAL)
  return os.path.isfile(path)  # local-path: `local_dir` is local


def local_dir(sweep_dir: str) -> str:
  """The folder of the sweep's journal and locks: `sweep_dir` itself, or
  for a URL (`gs://...`), where Optuna's journal (appends and file locks)
  and a flock cannot live, a local one named after it, outside the working
  directory: `$XDG_CACHE_HOME/trainer/sweeps/<name>` (`~/.cache` by
  default). `study.journal` there is copied to the URL as each trial starts
  and ends (`trainer.sweeps.journal`)."""
  if not files.is_url(sweep_dir):
    return sweep_dir
  url = sweep_dir.rstrip("/")
  # Readable, and told apart from URLs that read the same once cleaned.
  name = (_UNSAFE.sub("_", url)[:80] + "-" +
          hashlib.sha256(url.encode("utf-8")).hexdigest()[:10])
  cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(
      os.path.expanduser("~"), ".cache")
  return os.path.join(cache, "trainer", "sweeps", name)
