"""What a sweep left: the table sorted by the metric, `results.csv`, and
the best trial's `train.py` command.

  sweep | 4 trials: 3 COMPLETE, 1 FAIL | accuracy, maximize
    trial  state     accuracy  steps  seconds  optimizer.learning_rate
    1      COMPLETE  0.9722    60     11.2     0.01
    ...
  sweep | trial 3 FAIL: error: the training loss is not finite at step 2; ...
  sweep | results in runs/sweep/results.csv
  sweep | accuracy against each binding in runs/sweep/results.png
  best | trial 1 | accuracy 0.9722 | python train.py --gin_file=... ...
"""

import collections
import csv
import io
import math
import os
import shlex
from typing import Any, Dict, List, Optional, Sequence

import optuna
from optuna.trial import TrialState

from trainer import console
from trainer.storage import files
from trainer.sweeps import plot
from trainer.sweeps import space as space_lib
from trainer.sweeps import trial_run

CSV = "results.csv"
_ORDER = {TrialState.COMPLETE: 0, TrialState.PRUNED: 1, TrialState.RUNNING: 2,
          TrialState.WAITING: 3, TrialState.FAIL: 4}


def dir_name(trial) -> str:
  """The name of a trial's model_dir in the sweep directory: `trial-<n>`,
  or the fresh one it got because a run of other bindings was there (its
  `model_dir` attribute, relative to the sweep directory, which may be
  renamed). `trial`: a `FrozenTrial` or a `Trial`."""
  return trial.user_attrs.get("model_dir", f"trial-{trial.number}")


def model_dir(sweep_dir: str, trial) -> str:
  """A trial's model_dir, `sweep_dir/<dir_name>`."""
  return os.path.join(sweep_dir, dir_name(trial))


def state(trial: optuna.trial.FrozenTrial) -> str:
  """The trial's state; KILLED for a RUNNING one whose process a signal
  killed, which a rerun resumes."""
  if trial.state == TrialState.RUNNING and trial.user_attrs.get("killed"):
    return "KILLED"
  return trial.state.name


def metric_value(trial: optuna.trial.FrozenTrial) -> Optional[float]:
  """The trial's metric: its value, or its last evaluation reported."""
  if trial.value is not None:
    return trial.value
  if trial.intermediate_values:
    return trial.intermediate_values[max(trial.intermediate_values)]
  return None


def sorted_trials(trials: Sequence[optuna.trial.FrozenTrial],
                  direction: str) -> List[optuna.trial.FrozenTrial]:
  """Completed trials best first, then pruned (by their last evaluation),
  running and failed ones."""
  sign = -1.0 if direction == "maximize" else 1.0

  def key(trial):
    value = metric_value(trial)
    return (_ORDER.get(trial.state, 5),
            math.inf if value is None or value != value else sign * value,
            trial.number)
  return sorted(trials, key=key)


def _number(value: Optional[float], digits: int = 4) -> str:
  return "-" if value is None else f"{value:.{digits}f}"


def rows(trials: Sequence[optuna.trial.FrozenTrial],
         space: Sequence[space_lib.Dimension], metric: str,
         sweep_dir: str) -> List[Dict[str, Any]]:
  """One dict per trial, in the given order: the CSV's rows."""
  found = []
  for trial in trials:
    row = {"trial": trial.number, "state": state(trial),
           metric: metric_value(trial),
           "steps": trial.user_attrs.get("steps"),
           "seconds": trial.user_attrs.get("seconds")}
    for dimension in space:
      value = trial.params.get(dimension.binding)
      row[dimension.binding] = (None if value is None else
                                space_lib.plain_value(value))
    row["model_dir"] = model_dir(sweep_dir, trial)
    row["cause"] = trial.user_attrs.get("cause", "")
    found.append(row)
  return found


def table(found: Sequence[Dict[str, Any]], metric: str) -> List[str]:
  """The rows as aligned text lines, a header first."""
  columns = [name for name in (found[0] if found else {"trial": 0})
             if name not in ("model_dir", "cause")]
  cells = [[str(name) for name in columns]]
  for row in found:
    line = []
    for name in columns:
      value = row[name]
      if name == metric:
        line.append(_number(value))
      elif name == "seconds":
        line.append(_number(value, 1))
      else:
        line.append("-" if value is None else str(value))
    cells.append(line)
  widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
  return ["  " + "  ".join(cell.ljust(width) for cell, width in
                           zip(line, widths)).rstrip() for line in cells]


def write_csv(sweep_dir: str, found: Sequence[Dict[str, Any]]) -> str:
  """Writes `sweep_dir/results.csv` atomically; returns its path."""
  out = io.StringIO()
  if found:
    writer = csv.DictWriter(out, fieldnames=list(found[0]))
    writer.writeheader()
    writer.writerows(found)
  path = os.path.join(sweep_dir, CSV)
  files.write_text(path, out.getvalue())
  return path


def best_command(trial: optuna.trial.FrozenTrial, gin_files: Sequence[str],
                 gin_params: Sequence[str], mode: str, sweep_dir: str,
                 launcher: Sequence[str] = ()) -> str:
  """The best trial's full `train.py` command, ready to copy (under the
  sweep's `--launcher`, if any)."""
  params = list(gin_params) + space_lib.gin_params(trial.params)
  return shlex.join([*launcher, *trial_run.command(
      gin_files, params, mode, model_dir(sweep_dir, trial))])


def lines(trials: Sequence[optuna.trial.FrozenTrial],
          space: Sequence[space_lib.Dimension], metric: str, direction: str,
          gin_files: Sequence[str], gin_params: Sequence[str], mode: str,
          sweep_dir: str, launcher: Sequence[str] = (),
          unwritten: str = "") -> List[str]:
  """The closing report; writes `results.csv` and `results.png` on the
  way, unless `unwritten` says why not. `launcher` (`--launcher`) prefixes
  the best trial's command."""
  ordered = sorted_trials(trials, direction)
  found = rows(ordered, space, metric, sweep_dir)
  counts = collections.Counter(row["state"] for row in found)
  said = [f"sweep | {len(ordered)} trials: " +
          ", ".join(f"{count} {state}" for state, count in
                    sorted(counts.items())) + f" | {metric}, {direction}"]
  said += table(found, metric)
  if counts["PRUNED"]:
    # A pruned trial's metric is from the step it was pruned at, earlier in
    # training than a completed trial's: the two do not compare.
    said.append(f"sweep | PRUNED trials rank after COMPLETE ones, by their "
                f"{metric} at the step they were pruned at")
  said += [f"sweep | trial {row['trial']} {row['state']}: {row['cause']}"
           for row in found if row["cause"]]
  if unwritten:
    said.append(f"sweep | {CSV} and {plot.PNG} not written: {unwritten}")
  else:
    said.append(f"sweep | results in {write_csv(sweep_dir, found)}")
    drawn = plot.write(sweep_dir, found, space, metric)
    if drawn:
      said.append(f"sweep | {metric} against each binding in {drawn}")
  complete = [t for t in ordered if t.state == TrialState.COMPLETE]
  if complete:
    best = complete[0]
    said.append(f"best | trial {best.number} | {metric} "
                f"{_number(best.value)} | " +
                best_command(best, gin_files, gin_params, mode, sweep_dir,
                             launcher))
  return said


def print_lines(said: Sequence[str]) -> None:
  """Prints the report's lines (`console.info`)."""
  for line in said:
    console.info(line)
