"""TensorBoard's HParams dashboard for a sweep.

The sweep directory gets the experiment (the swept bindings and the metric)
and each `trial-<n>` directory its session (the trial's values), so that
`tensorboard --logdir SWEEP_DIR` shows every trial in the HParams table,
parallel coordinates and scatter plots, with the metric read from the
trial's own `eval/` summaries. Written with TensorBoard's pure-Python event
writer: the sweep process needs no TensorFlow graph for it.
"""

import time
from typing import Any, Dict, Sequence

from tensorboard.compat.proto import event_pb2
from tensorboard.plugins.hparams import api as hp
from tensorboard.summary.writer import event_file_writer

from sweeps import space as space_lib

EVAL_GROUP = "eval"


def _one_type(dimension: space_lib.Dimension) -> bool:
  """Whether a choice's values are all numbers, or all strings, ...: the
  HParams plugin's `Discrete` takes one type; mixed ones stay gin text."""
  return len({type(space_lib.plain_value(choice))
              for choice in dimension.choices}) == 1


def _value(dimension: space_lib.Dimension, value: Any) -> Any:
  if dimension.kind == "choice" and not _one_type(dimension):
    return value
  return space_lib.plain_value(value)


def _domain(dimension: space_lib.Dimension) -> hp.Domain:
  if dimension.kind == "int":
    return hp.IntInterval(int(dimension.low), int(dimension.high))
  if dimension.kind != "choice":
    return hp.RealInterval(dimension.low, dimension.high)
  return hp.Discrete([_value(dimension, choice)
                      for choice in dimension.choices])


def _write(log_dir: str, summary) -> None:
  writer = event_file_writer.EventFileWriter(log_dir,
                                             filename_suffix=".hparams")
  writer.add_event(event_pb2.Event(wall_time=time.time(), summary=summary))
  writer.close()


def write_experiment(sweep_dir: str,
                     space: Sequence[space_lib.Dimension],
                     metric: str) -> None:
  """Writes the experiment: the swept bindings and the metric."""
  hparams = [hp.HParam(dimension.binding, _domain(dimension))
             for dimension in space]
  metrics = [hp.Metric(metric, group=EVAL_GROUP,
                       display_name=f"{EVAL_GROUP}/{metric}")]
  _write(sweep_dir, hp.hparams_config_pb(hparams, metrics))


def write_session(model_dir: str, trial_name: str,
                  space: Sequence[space_lib.Dimension],
                  params: Dict[str, Any]) -> None:
  """Writes a trial's session: its value of each swept binding."""
  values = {dimension.binding: _value(dimension, params[dimension.binding])
            for dimension in space}
  _write(model_dir, hp.hparams_pb(values, trial_id=trial_name))
