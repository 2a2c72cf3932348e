"""Actions run between loops: Orbit's `Action` protocol, a callable taking
the loop's output (train actions) or the evaluation's results (eval actions).

Best-checkpoint tracking reuses Orbit's `NewBestMetric` for the comparison;
its own JSON file holds only the value, so the record here (step, value,
files) is written next to the checkpoint it names, atomically. Early
stopping has no Orbit counterpart. Both keep their state in `model_dir`, so a
restarted run remembers the best so far and the evaluations without
improvement.
"""

import dataclasses
import glob
import math
import os
import shutil
from typing import Any, Callable, Dict, List, Optional

import gin
import orbit

from trainer import checks
from trainer import console
from trainer import errors
from trainer import exports
from trainer import files
from trainer import loop_hooks
from trainer import summaries

BEST_DIRECTORY = "best"
BEST_RECORD = "best.json"
EARLY_STOPPING_RECORD = "early_stopping.json"


def _check_direction(prefix: str, metric: Optional[str],
                     higher_is_better: Optional[bool]) -> None:
  """Checks that a config naming a metric says which way is better."""
  checks.require(
      metric is None or isinstance(higher_is_better, bool),
      f"`{prefix}.higher_is_better` must be True or False for metric "
      f"{metric!r}.")


def _metric_value(name: str, metric: str, output: Dict[str, Any]) -> float:
  if metric not in output:
    raise errors.ConfigError(
        f"`{name}.metric` ({metric!r}) is not an eval result; the results "
        f"are: {', '.join(sorted(output))}.")
  return float(output[metric])


@gin.configurable("best_checkpoint")
@dataclasses.dataclass(frozen=True)
class BestCheckpointConfig:
  """Keeping the best checkpoint, bound as `best_checkpoint.<name>`.

  Attributes:
    metric: The eval result to judge by (e.g. `accuracy`); None keeps no
      best checkpoint.
    higher_is_better: Whether a higher `metric` is better; required with it.
  """
  metric: Optional[str] = None
  higher_is_better: Optional[bool] = None

  def __post_init__(self):
    _check_direction("best_checkpoint", self.metric, self.higher_is_better)


class BestCheckpoint:
  """Eval action: keeps the checkpoint with the best eval `metric`.

  In `model_dir/best/`: `ckpt-<step>.*` (the whole training state at that
  step), `best.json` (`step`, `metric`, `value`, `higher_is_better`,
  `checkpoint`, `export`) and, with `export_fn`, `export/<step>/`. The new
  checkpoint and export are written first, then the record, then the
  previous best is removed: a crash leaves the old best or the new one.
  """

  def __init__(self, model_dir: str, config: BestCheckpointConfig,
               step_fn: Callable[[], int],
               save_fn: Callable[[str], None],
               export_fn: Optional[Callable[[str], None]] = None):
    """Reads the record of an earlier run, if any.

    Args:
      model_dir: The run's directory (`best/` goes inside).
      config: The metric and its direction.
      step_fn: Returns the step of the evaluated weights.
      save_fn: Writes the evaluated state as a checkpoint at a prefix.
      export_fn: Writes a SavedModel of the evaluated weights to a
        directory; None for no export.
    """
    self.directory = os.path.join(model_dir, BEST_DIRECTORY)
    self._config = config
    self._step_fn = step_fn
    self._save_fn = save_fn
    self._export_fn = export_fn
    self._best = orbit.actions.NewBestMetric(
        config.metric, higher_is_better=config.higher_is_better)
    self.record = files.read_json(os.path.join(self.directory, BEST_RECORD))
    if self.record and (self.record["metric"], self.record[
        "higher_is_better"]) == (config.metric, config.higher_is_better):
      self._best.commit({config.metric: self.record["value"]})
    elif self.record:
      console.warning(
          f"best_checkpoint: {self.directory} judged "
          f"{self.record['metric']}; starting over with {config.metric}")
      self.record = None

  def __call__(self, output: Dict[str, Any]) -> None:
    value = _metric_value("best_checkpoint", self._config.metric, output)
    if not self._best.test({self._config.metric: value}):
      return
    step = self._step_fn()
    name = f"ckpt-{step}"
    os.makedirs(self.directory, exist_ok=True)
    self._save_fn(os.path.join(self.directory, name))
    export = None
    if self._export_fn is not None:
      export = os.path.join("export", str(step))
      self._export_fn(os.path.join(self.directory, export))
    self.record = {"step": step, "metric": self._config.metric,
                   "value": value,
                   "higher_is_better": self._config.higher_is_better,
                   "checkpoint": name, "export": export}
    files.write_json(os.path.join(self.directory, BEST_RECORD), self.record)
    self._best.commit({self._config.metric: value})
    for path in glob.glob(os.path.join(self.directory, "ckpt-*")):
      if os.path.isdir(path):  # `ckpt-N_temp`, left by a killed save.
        shutil.rmtree(path, ignore_errors=True)
      elif not os.path.basename(path).startswith(name + "."):
        os.remove(path)
    exports.keep_newest(os.path.join(self.directory, "export"),
                        1 if export else 0)
    console.info(f"best | step {step}: {self._config.metric} {value:.4f}, "
                 f"the best so far; kept in {self.directory}")


@gin.configurable("early_stopping")
@dataclasses.dataclass(frozen=True)
class EarlyStoppingConfig:
  """Stopping when an eval metric stops improving, bound as
  `early_stopping.<name>`.

  Attributes:
    metric: The eval result to watch; None never stops early.
    higher_is_better: Whether a higher `metric` is better; required with it.
    patience: Stop after this many evaluations in a row without
      improvement.
    min_delta: The smallest change that counts as an improvement.
  """
  metric: Optional[str] = None
  higher_is_better: Optional[bool] = None
  patience: int = 5
  min_delta: float = 0.0

  def __post_init__(self):
    _check_direction("early_stopping", self.metric, self.higher_is_better)
    checks.integer("early_stopping.patience", self.patience, minimum=1)
    checks.at_least("early_stopping.min_delta", self.min_delta, 0)


class EarlyStopping(loop_hooks.LoopHook):
  """Eval action that decides when training should stop, and the loop hook
  that stops it (`stop_reason()`, asked before every loop).

  The record, `model_dir/early_stopping.json`, holds every evaluated step's
  value, written by whichever process evaluates: the training process in
  `train_and_eval`, or a `continuous_eval` process beside a `train` one,
  which then stops at its next loop. The decision (best value and step,
  evaluations since) is derived from those values in step order, so it
  depends only on which steps were evaluated: an evaluation run again after
  a restart replaces its step's value instead of counting twice, and one of
  a step later than the one evaluated (a timeline a restart went back on)
  is dropped. A restarted run that had stopped stays stopped; raising
  `patience` lets it go on.
  """

  def __init__(self, model_dir: str, config: EarlyStoppingConfig,
               step_fn: Callable[[], int]):
    self._path = os.path.join(model_dir, EARLY_STOPPING_RECORD)
    self._config = config
    self._step_fn = step_fn
    self._mtime = None
    self.values: Dict[int, float] = {}  # Evaluated step -> metric value.
    self.state = None  # The decision derived from `values`.
    self._reload()

  def _reload(self) -> None:
    try:
      mtime = os.stat(self._path).st_mtime_ns
    except FileNotFoundError:
      return
    if mtime != self._mtime:
      self._mtime = mtime
      record = files.read_json(self._path)
      if record and (record["metric"], record["higher_is_better"]) == (
          self._config.metric, self._config.higher_is_better):
        self.values = {int(step): value
                       for step, value in record.get("values", {}).items()}
        self.state = self._decide()

  def _decide(self) -> Optional[Dict[str, Any]]:
    """Replays the evaluations in step order: the best and the count since."""
    state = None
    for step in sorted(self.values):
      value = self.values[step]
      if state is None:
        if not math.isnan(value):
          state = {"best": value, "best_step": step,
                   "evaluations_since_best": 0}
        continue
      delta = value - state["best"]
      if not self._config.higher_is_better:
        delta = -delta
      if delta > self._config.min_delta:
        state = {"best": value, "best_step": step,
                 "evaluations_since_best": 0}
      else:
        state["evaluations_since_best"] += 1
    return state

  def __call__(self, output: Dict[str, Any]) -> None:
    value = _metric_value("early_stopping", self._config.metric, output)
    self._reload()
    step = self._step_fn()
    self.values = {s: v for s, v in self.values.items() if s < step}
    self.values[step] = value
    self.state = self._decide()
    record = {"metric": self._config.metric,
              "higher_is_better": self._config.higher_is_better,
              "values": {str(s): v for s, v in sorted(self.values.items())},
              "last_step": step}
    record.update(self.state or {})
    files.write_json(self._path, record)
    self._mtime = os.stat(self._path).st_mtime_ns
    reason = self.stop_reason()
    if reason:
      console.info(f"early stopping | {reason}")

  def stop_reason(self) -> Optional[str]:
    """Why training should stop now, or None to go on."""
    self._reload()
    if self.state is None or (self.state["evaluations_since_best"] <
                              self._config.patience):
      return None
    return (f"{self._config.metric} has not improved on "
            f"{self.state['best']:.4f} (step {self.state['best_step']}) for "
            f"{self.state['evaluations_since_best']} evaluations (patience "
            f"{self._config.patience})")


class OperativeConfigWriter:
  """Train action: saves the operative gin config once, after the first loop.

  Gin only knows which parameters were used once the configurables ran.
  """

  def __init__(self, model_dir: str, writer: Optional[summaries.Writer]):
    self._model_dir = model_dir
    self._writer = writer
    self._done = False

  def __call__(self, unused_output) -> None:
    if self._done:
      return
    self._done = True
    path = summaries.write_operative_config(self._model_dir, self._writer,
                                            step=0)
    console.log(f"wrote {path}")


# Random ops whose state no checkpoint holds.
STATEFUL_RANDOM_OPS = frozenset([
    "RandomUniform", "RandomUniformInt", "RandomStandardNormal",
    "TruncatedNormal", "RandomShuffle", "Multinomial", "RandomGamma",
    "RandomPoisson", "RandomPoissonV2", "RandomCrop"])


def stateful_random_ops(traced) -> List[str]:
  """Returns `"OpType (node name)"` for each stateful random op in `traced`.

  Ops such as `RandomUniform` (`tf.random.uniform`, tf_keras `Dropout`)
  keep their state outside any checkpoint, so a resumed run draws other
  numbers than an uninterrupted one. Stateless ops seeded from the step
  (`tf.random.stateless_*`) resume exactly.

  Args:
    traced: A concrete function (`TaskTrainer.traced_loop()`), or None.
  """
  if traced is None:
    return []
  graph = traced.graph.as_graph_def()
  nodes = list(graph.node) + [node for function in graph.library.function
                              for node in function.node_def]
  return sorted({f"{node.op} ({node.name})" for node in nodes
                 if node.op in STATEFUL_RANDOM_OPS})


class StatefulRandomCheck:
  """Train action: after the first loop, warns about stateful random ops.

  Only with `runtime.deterministic`, where the user asked for exactness.
  """

  def __init__(self, trace_fn: Callable[[], Any], enabled: bool):
    """`trace_fn` returns the traced training loop (or None)."""
    self._trace_fn = trace_fn
    self._done = not enabled

  def __call__(self, unused_output) -> None:
    if self._done:
      return
    self._done = True
    found = stateful_random_ops(self._trace_fn())
    if found:
      console.warning(
          "runtime.deterministic: the train step uses stateful random ops "
          f"({', '.join(found[:3])}{', ...' if len(found) > 3 else ''}); "
          "their state is not checkpointed, so a resumed run will differ. "
          "Use tf.random.stateless_* ops seeded from the step.")
