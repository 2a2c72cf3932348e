"""The study: Optuna's storage, sampler and pruner, and what a sweep is.

By default the study lives in `sweep_dir/study.journal`, Optuna's journal
file storage: nothing to start, and made for shared filesystems (a
cluster's NFS). `--storage` takes an RDB URL instead (SQLite, PostgreSQL).
A study records what it sweeps (the space, the metric and direction, the
base configuration); a command asking for another is refused, not mixed in.
A journal holds one sweep's study: found whatever its name, so that a
renamed sweep directory keeps it. A URL sweep directory's journal is kept
on this machine and copied to the URL (`trainer.sweeps.journal`).
"""

import errno
import os
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import optuna

from trainer import errors
from trainer.storage import files
from trainer.sweeps import journal
from trainer.sweeps import space as space_lib
from trainer.sweeps import warm

JOURNAL = warm.JOURNAL
SAMPLERS = ("grid", "random", "tpe")
PRUNERS = ("none", "median", "hyperband")
DIRECTIONS = ("maximize", "minimize")
_IDENTITY = "sweep"
# Longer than an append of a few records takes (milliseconds).
_WRITE_SECONDS = 0.5


def name(sweep_dir: str,
         storage: Optional[optuna.storages.BaseStorage] = None) -> str:
  """The study's name: a journal's only study's, else the sweep
  directory's name (a new study's, and an RDB's study)."""
  if isinstance(storage, journal.Storage):
    names = optuna.study.get_all_study_names(storage)
    if len(names) == 1:
      return names[0]
  return os.path.basename(files.absolute(sweep_dir).rstrip("/")) or "sweep"


def open_storage(sweep_dir: str, url: Optional[str], repair: bool = True
                 ) -> optuna.storages.BaseStorage:
  """Opens (creating if needed) the study's storage; a journal's bad tail
  is cut back first (`trainer.sweeps.journal`) unless `repair` is False (a read
  that writes nothing: it stops at the bad record). A URL sweep directory's
  journal is its local copy, brought from the URL first where that has
  more (`journal.restore`).

  Raises:
    OSError: A bad tail cannot be cut (a read-only or full disk).
    errors.ConfigError: The local copy and the URL's went separate ways.
  """
  if url:
    return optuna.storages.RDBStorage(url)
  journal.restore(sweep_dir)
  path = journal.path(sweep_dir)
  if repair:
    files.makedirs(os.path.dirname(path))
    journal.repair(path)
  elif not files.exists(path):
    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
  return journal.Storage(path)


def load(sweep_dir: str, url: Optional[str], repair: bool = True
         ) -> optuna.Study:
  """Loads the sweep's existing study (`open_storage`)."""
  storage = open_storage(sweep_dir, url, repair)
  return optuna.load_study(study_name=name(sweep_dir, storage),
                           storage=storage)


def damage(study: optuna.Study) -> Optional[str]:
  """Where the last read of a journal study stopped at a bad record (or
  one being written), or None: the study read is then the state before
  it."""
  # pylint: disable-next=protected-access
  return getattr(study._storage, "damage", None)


def whole_trials(study: optuna.Study
                 ) -> Tuple[List[optuna.trial.FrozenTrial], Optional[str]]:
  """The study's trials, and where the read stopped at a bad record if it
  did (None: the read is whole). A record that another process was
  writing is whole when read again a moment later; a damaged one is not.
  """
  trials = study.get_trials()
  if damage(study):
    time.sleep(_WRITE_SECONDS)
    trials = study.get_trials()
  return trials, damage(study)


def exists(sweep_dir: str, url: Optional[str]) -> bool:
  """Whether the sweep's study exists; writes nothing for a journal."""
  if not url:
    journal.restore(sweep_dir)
    return files.exists(journal.path(sweep_dir)) and bool(
        optuna.study.get_all_study_names(open_storage(sweep_dir, url,
                                                      repair=False)))
  try:
    names = optuna.study.get_all_study_names(open_storage(sweep_dir, url))
  except Exception as e:  # A bad URL, a missing driver, a server down.
    raise errors.ConfigError(
        f"--storage ({url}) cannot be opened: {str(e).splitlines()[0]}"
    ) from e
  return name(sweep_dir) in names


def identity(space: Sequence[space_lib.Dimension], metric: str,
             direction: str, gin_files: Sequence[str],
             gin_params: Sequence[str], mode: str) -> Dict[str, Any]:
  """What a sweep is: a command giving another may not join its study."""
  return {"space": [dimension.spec for dimension in space],
          "metric": metric, "direction": direction,
          "gin_files": list(gin_files), "gin_params": list(gin_params),
          "mode": mode}


_FLAGS = {"space": "--space", "metric": "--metric",
          "direction": "--direction", "gin_files": "--gin_file",
          "gin_params": "--gin_param", "mode": "--mode"}


def trials_left(study: optuna.Study, total: int) -> int:
  """The trials of `total` not finished yet: to run, or to resume (those a
  dead worker left RUNNING)."""
  finished = sum(trial.state.is_finished()
                 for trial in study.get_trials(deepcopy=False))
  return max(total - finished, 0)


def check_identity(study: optuna.Study, wanted: Dict[str, Any],
                   sweep_dir: str) -> None:
  """Raises `errors.ConfigError` if `study` sweeps something else."""
  recorded = study.user_attrs.get(_IDENTITY, {})
  for key, flag in _FLAGS.items():
    if recorded.get(key) != wanted[key]:
      raise errors.ConfigError(
          f"the sweep in {sweep_dir} has {flag} {recorded.get(key)}, not "
          f"{wanted[key]}: rerun it with its own flags, or give a new "
          "--sweep_dir.")


class _AskTellGridSampler(optuna.samplers.GridSampler):
  """Optuna's `GridSampler` for ask-and-tell.

  Its `after_trial` only calls `study.stop()` once the grid is done, which
  ends `study.optimize` and raises outside it; the sweep runs ask-and-tell
  (a trial is a process it launches and may resume) and stops at the
  grid's size itself.
  """

  def after_trial(self, study, trial, state, values) -> None:
    del study, trial, state, values


def sampler(kind: str, seed: Optional[int],
            space: Sequence[space_lib.Dimension]
            ) -> optuna.samplers.BaseSampler:
  """Optuna's sampler for `--sampler`."""
  if kind == "grid":
    return _AskTellGridSampler(space_lib.grid(space), seed=seed)
  if kind == "random":
    return optuna.samplers.RandomSampler(seed=seed)
  return optuna.samplers.TPESampler(seed=seed)


def pruner(kind: str, startup_trials: int) -> optuna.pruners.BasePruner:
  """Optuna's pruner for `--pruner`, fed each evaluation of the metric."""
  if kind == "median":
    return optuna.pruners.MedianPruner(n_startup_trials=startup_trials)
  if kind == "hyperband":
    return optuna.pruners.HyperbandPruner()
  return optuna.pruners.NopPruner()


def open_study(sweep_dir: str, url: Optional[str], wanted: Dict[str, Any],
               sampler_: optuna.samplers.BaseSampler,
               pruner_: optuna.pruners.BasePruner) -> optuna.Study:
  """Loads the sweep's study, or creates it with `wanted` recorded.

  Callers hold the sweep's claims lock, so two processes starting at once
  do not both create it.

  Raises:
    errors.ConfigError: The study exists and sweeps something else.
  """
  storage = open_storage(sweep_dir, url)
  study = optuna.create_study(
      storage=storage, study_name=name(sweep_dir, storage), sampler=sampler_,
      pruner=pruner_, direction=wanted["direction"], load_if_exists=True)
  if _IDENTITY not in study.user_attrs and not study.trials:
    study.set_user_attr(_IDENTITY, wanted)
  check_identity(study, wanted, sweep_dir)
  return study
