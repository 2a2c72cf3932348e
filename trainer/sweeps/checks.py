"""Bad input, found before any trial starts: each is one line, exit 2.

Every swept value is bound in turn, with the base configuration, and
loaded as `train.py` loads a run (names gin knows, values the settings
accept); then one trial's configuration runs `train.py --dry_run`, which
builds everything and evaluates once, so that the metric is checked
against what the Task's evaluation really produces.
"""

import os
import subprocess
import tempfile
from typing import Any, Dict, List, Optional, Sequence

import gin

from trainer import config as config_lib
from trainer import errors
from trainer import gin_config
from trainer.sweeps import space as space_lib
from trainer.sweeps import trial_run
from trainer.sweeps import warm

SWEPT_MODE = "train_and_eval"


def check_mode(mode: str) -> None:
  """A sweep reads each trial's evaluations: only `train_and_eval` has
  them as it trains."""
  if mode != SWEPT_MODE:
    raise errors.ConfigError(
        f"--mode={mode}: a sweep compares each trial's evaluations; use "
        f"--mode={SWEPT_MODE}.")


def grid_trials(size: int, n_trials: int, partial: bool) -> int:
  """Returns the trials a grid of `size` points runs: all of them, or with
  `partial` (`--partial_grid`) at most `n_trials` of them.

  Raises:
    errors.ConfigError: If the grid does not fit in `n_trials` and
      `partial` is not set.
  """
  if size > n_trials and not partial:
    raise errors.ConfigError(
        f"the grid has {size} points, more than --n_trials={n_trials}: "
        "raise --n_trials, sample it with --sampler=random or tpe, or run "
        "--n_trials of its points with --partial_grid.")
  return min(size, n_trials) if partial else size


def load_trial_configs(gin_files: Sequence[str], gin_params: Sequence[str],
                       space: Sequence[space_lib.Dimension]
                       ) -> config_lib.TrainerConfig:
  """Loads the configuration with each swept value in turn; returns the
  trainer settings of the first point.

  Raises:
    errors.ConfigError: The base configuration, or one swept value, is
      refused; the line names the value.
  """
  config = _load(gin_files, gin_params)
  # Each value is bound beside the first values of the dimensions checked
  # before it only: a later dimension's bad binding would otherwise fail
  # the first dimension's check, and its line would blame the wrong flag.
  checked = {}
  for dimension in space:
    for value in dimension.edge_values():
      point = dict(checked)
      point[dimension.binding] = value
      try:
        _load(gin_files, list(gin_params) + space_lib.gin_params(point))
      except errors.ConfigError as e:
        raise errors.ConfigError(
            f"`--space={dimension.spec}`: {dimension.binding}="
            f"{space_lib.gin_text(value)}: {e}") from e
    checked[dimension.binding] = dimension.edge_values()[0]
  return config


def _load(gin_files: Sequence[str], gin_params: Sequence[str]
          ) -> config_lib.TrainerConfig:
  try:
    return gin_config.load_config(gin_files, gin_params)[2]
  finally:
    gin.clear_config()


def _results_names(line: str) -> List[str]:
  """`accuracy`, `loss` from `dry run | ok: ... | accuracy 0.1 | loss 2.3`."""
  return [part.rsplit(" ", 1)[0] for part in line.split(" | ")[2:]]


class DryRun:
  """`train.py --dry_run` on one trial's configuration, started at once in
  the background (it takes seconds: TensorFlow starts, the model is built
  and traced), while the sweep checks the rest.

  Args:
    gin_files: The sweep's `--gin_file`s.
    gin_params: The sweep's `--gin_param`s.
    point: The trial's bindings, `{binding: gin text}`.
    launcher: The command trials run under (`--launcher`): the dry run
      runs under it too, as a multi-worker trial would.
    python: A process that loaded TensorFlow already, to run the dry run
      in; None: a new one (under `launcher`, if any).
  """

  def __init__(self, gin_files: Sequence[str], gin_params: Sequence[str],
               point: Dict[str, Any], launcher: Sequence[str] = (),
               python: Optional[warm.WarmPython] = None):
    self._bindings = space_lib.gin_params(point)
    self._directory = tempfile.TemporaryDirectory(  # local-path: scratch
        prefix="sweep-dry-run-")
    # A model_dir that does not exist: the dry run neither reads nor
    # writes it.
    argv = trial_run.command(gin_files, list(gin_params) + self._bindings,
                             SWEPT_MODE,
                             os.path.join(self._directory.name, "trial"))
    if python is not None:
      self._process = python.run(argv[1:] + ["--dry_run"])
      return
    self._process = subprocess.Popen(
        trial_run.launch(launcher, argv) + ["--dry_run"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"))

  def metrics(self) -> List[str]:
    """Waits for the dry run; returns the names of its evaluation's
    results.

    Raises:
      errors.ConfigError: The dry run failed; the line is its error.
    """
    output, _ = self._process.communicate()
    self._directory.cleanup()
    lines = [line for line in output.splitlines() if line]
    if self._process.returncode != 0:
      raise errors.ConfigError(
          f"the dry run of a trial ({' '.join(self._bindings)}) failed: "
          f"{trial_run.cause(lines, self._process.returncode)}")
    for line in lines:
      if line.startswith("dry run | ok:"):
        return _results_names(line)
    return []

  def cancel(self) -> None:
    """Ends the dry run if it still runs."""
    if self._process.poll() is None:
      self._process.kill()
      self._process.communicate()
    self._directory.cleanup()


def check_metric(metric: str, names: Sequence[str]) -> None:
  """The metric must be one of the evaluation's results."""
  if metric not in names:
    raise errors.ConfigError(
        f"--metric={metric} is not a result of the task's evaluation, which "
        f"gives: {', '.join(names) or 'nothing'}.")
