"""TensorBoard's HParams dashboard for a sweep.

The sweep directory gets the experiment (the swept bindings and the metric)
and each `trial-<n>` directory its session (the trial's values), so that
`tensorboard --logdir SWEEP_DIR` shows every trial in the HParams table,
parallel coordinates and scatter plots, with the metric read from the
trial's own `eval/` summaries. Written with TensorBoard's pure-Python event
writer: the sweep process needs no TensorFlow graph for it.
"""

import time
from typing import Any, Dict, Optional, Sequence

from tensorboard.compat.proto import event_pb2
from tensorboard.compat.proto import summary_pb2
from tensorboard.plugins.hparams import api as hp
from tensorboard.plugins.hparams import api_pb2
from tensorboard.plugins.hparams import metadata
from tensorboard.plugins.hparams import plugin_data_pb2
from tensorboard.summary.writer import event_file_writer

from trainer.sweeps import space as space_lib

EVAL_GROUP = "eval"

# A finished trial's Optuna state as the dashboard's status. TensorBoard
# has no "pruned": a pruned trial is Unknown with its end time, so that
# Success alone shows the completed trials and Failure the failed ones.
# A trial with no end (running, or stopped to be resumed) is Unknown too,
# with end time 0.
STATUSES = {"COMPLETE": api_pb2.STATUS_SUCCESS,
            "FAIL": api_pb2.STATUS_FAILURE,
            "PRUNED": api_pb2.STATUS_UNKNOWN}


def _one_type(dimension: space_lib.Dimension) -> bool:
  """Whether a choice's values are all numbers, or all strings, ...: the
  HParams plugin's `Discrete` takes one type; mixed ones stay gin text."""
  return len({type(space_lib.plain_value(choice))
              for choice in dimension.choices}) == 1


def _integers(dimension: space_lib.Dimension) -> bool:
  """Whether a choice lists whole numbers only (`[32, 64]`)."""
  values = [space_lib.plain_value(choice) for choice in dimension.choices]
  return dimension.kind == "choice" and all(
      isinstance(value, int) and not isinstance(value, bool)
      for value in values)


# An integer range of at most this many values is listed like a choice of
# integers; a wider one stays a number (TensorBoard's only number type, a
# float) rather than hundreds of categories on an axis.
LISTED_INTEGERS = 32


def _listed_range(dimension: space_lib.Dimension) -> bool:
  """Whether an `int(a, b)` range is written as its integers' text."""
  return (dimension.kind == "int" and
          int(dimension.high) - int(dimension.low) < LISTED_INTEGERS)


def _value(dimension: space_lib.Dimension, value: Any) -> Any:
  if dimension.kind == "choice" and not _one_type(dimension):
    return value
  if _listed_range(dimension):
    return str(int(space_lib.plain_value(value)))
  if _integers(dimension):
    # TensorBoard has one number type, a float the dashboard prints as
    # `32.000`: a choice of integers is written as its gin text, which it
    # shows as listed, one category each.
    return str(space_lib.plain_value(value))
  return space_lib.plain_value(value)


class _Listed(hp.Discrete):
  """A discrete domain in the order of its `--space` list (`Discrete` sorts
  its values: as text, `128` would come before `32`)."""

  def __init__(self, values):
    super().__init__(values)
    self._values = list(values)


def _domain(dimension: space_lib.Dimension) -> hp.Domain:
  if _listed_range(dimension):
    return _Listed([str(value) for value in
                    range(int(dimension.low), int(dimension.high) + 1)])
  if dimension.kind == "int":
    return hp.IntInterval(int(dimension.low), int(dimension.high))
  if dimension.kind != "choice":
    return hp.RealInterval(dimension.low, dimension.high)
  values = [_value(dimension, choice) for choice in dimension.choices]
  return _Listed(values) if _integers(dimension) else hp.Discrete(values)


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


def write_session_end(model_dir: str, state: str,
                      end_time_secs: Optional[float] = None) -> None:
  """Writes a finished trial's session end: its status (`STATUSES` of its
  Optuna state's name) and end time, now unless given. TensorBoard reads
  the first one of a session only: write it once, when the trial ends."""
  info = plugin_data_pb2.SessionEndInfo(
      status=STATUSES[state],
      end_time_secs=time.time() if end_time_secs is None else end_time_secs)
  summary = summary_pb2.Summary()
  summary.value.add(
      tag=metadata.SESSION_END_INFO_TAG, tensor=metadata.NULL_TENSOR,
      metadata=metadata.create_summary_metadata(
          plugin_data_pb2.HParamsPluginData(session_end_info=info)))
  _write(model_dir, summary)
