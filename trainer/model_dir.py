"""Who writes where: `model_dir` for the chief, under its leases; a temporary
directory for every other worker.

The chief takes its leases on `model_dir` (`trainer.storage.lease`) before it
changes anything there, so a second run exits leaving it untouched; then it
removes what interrupted writes of its own roles left, and only those.
"""

import contextlib
import os
from typing import Iterator, List

from trainer import actions
from trainer import config as config_lib
from trainer import console
from trainer.distribute import cluster
from trainer.report import summaries
from trainer.storage import checkpoints
from trainer.storage import files
from trainer.storage import lease

# What each lease holder writes at the top of model_dir: it removes the
# leftovers of its own interrupted writes there, and only those.
WRITTEN_BY = {
    lease.TRAINER: (checkpoints.SAVES, summaries.OPERATIVE_CONFIG_FILE,
                    "export"),
    lease.EVALUATOR: (actions.BEST_DIRECTORY, "eval",
                      actions.EARLY_STOPPING_RECORD),
}


def lease_roles(mode: str, config: config_lib.TrainerConfig) -> List[str]:
  """Returns the leases on `model_dir` a chief running `mode` must hold: the
  trainer's to train, the evaluator's to write evaluation records (`best/`,
  early stopping, `eval/evaluated.json`). A plain `eval` takes none."""
  roles = []
  if mode in ("train", "train_and_eval"):
    roles.append(lease.TRAINER)
  records = (config.best_checkpoint.metric is not None or
             config.early_stopping.metric is not None)
  if mode in ("train_and_eval", "continuous_eval") or (
      mode == "eval" and records):
    roles.append(lease.EVALUATOR)
  return roles


@contextlib.contextmanager
def write_directory(model_dir: str, worker: cluster.WorkerInfo, mode: str,
                    config: config_lib.TrainerConfig) -> Iterator[str]:
  """Yields where this process writes: `model_dir` for the chief only.

  Other workers take part in every save and summary (they may involve
  collectives) but write into a temporary directory of their own, removed
  afterwards, so no two processes ever write the same file.

  Raises:
    errors.ConfigError: If another process holds one of the leases.
  """
  if worker.is_chief:
    created = _make_directories(model_dir)
    try:
      roles = lease_roles(mode, config)
      with lease.Lease(model_dir, roles, mode, warn=console.warning):
        checkpoints.remove_interrupted_saves(
            model_dir, [name for role in roles for name in WRITTEN_BY[role]])
        yield model_dir
    except BaseException:
      # A run that failed before writing anything leaves no trace, as a
      # configuration error does.
      _remove_empty(created)
      raise
    return
  directory = files.scratch_directory(f"worker{worker.worker_index}-")
  try:
    yield directory
  finally:
    files.rmtree(directory)


def _make_directories(path: str) -> List[str]:
  """Makes `path` and its missing parents; returns those made, deepest
  first. A URL directory, which an object store has only while objects are
  below it, is marked (`files.mark_directory`) to have an identity."""
  if files.is_url(path):
    made = [] if files.directory_identity(path) else [path]
    files.makedirs(path)
    files.mark_directory(path)
    return made
  missing = []
  while path and not files.isdir(path):
    missing.append(path)
    parent = os.path.dirname(path.rstrip(os.sep)) or os.curdir
    if parent == path:
      break
    path = parent
  for directory in reversed(missing):
    files.makedirs(directory)
  return missing


def _remove_empty(directories: List[str]) -> None:
  """Removes each of `directories` (deepest first) that holds nothing (a
  URL's: nothing but its identity marker)."""
  for directory in directories:
    if files.is_url(directory):
      if files.listdir(directory) not in ([], [files.IDENTITY_MARKER]):
        return  # Another run wrote there.
      files.rmtree(directory)
      continue
    try:
      os.rmdir(directory)  # local-path: not a URL; only if empty
    except OSError:  # Not empty (another run wrote there), or gone.
      return
