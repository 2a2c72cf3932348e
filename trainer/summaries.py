"""TensorBoard summaries, the operative gin config and the progress line."""

import os
from typing import Mapping, Optional, Union

import gin
import numpy as np
import tensorflow as tf

from trainer import files

OPERATIVE_CONFIG_FILE = "operative_config.gin"


class LazyWriter:
  """A summary writer for `log_dir`, created when first written to.

  `tf.summary.create_file_writer` creates an event file at once; a run
  that stops before its first summary (a bad checkpoint, a bad setting)
  must leave `model_dir` as it found it.
  """

  def __init__(self, log_dir: str):
    self.log_dir = log_dir
    self._writer = None

  def as_default(self, step: Optional[int] = None):
    return self._get().as_default(step=step)

  def flush(self) -> None:
    if self._writer is not None:
      self._writer.flush()

  def _get(self) -> tf.summary.SummaryWriter:
    if self._writer is None:
      self._writer = tf.summary.create_file_writer(self.log_dir)
    return self._writer


# What summaries are written through.
Writer = Union[tf.summary.SummaryWriter, LazyWriter]


def write_scalars(writer: Writer, scalars: Mapping[str, object], step: int,
                  flush: bool = True) -> None:
  """Writes each value of `scalars` as a scalar summary at `step`."""
  with writer.as_default(step=step):
    for name, value in scalars.items():
      tf.summary.scalar(name, value)
  if flush:
    writer.flush()


def write_operative_config(directory: str,
                           writer: Optional[Writer],
                           step: int) -> str:
  """Saves the gin parameters actually used, as a file and a text summary.

  Returns:
    The path of the written `operative_config.gin`.
  """
  config = gin.operative_config_str()
  path = os.path.join(directory, OPERATIVE_CONFIG_FILE)
  files.write_text(path, config)
  if writer is not None:
    with writer.as_default(step=step):
      # Indented lines render as a code block in TensorBoard's markdown.
      tf.summary.text("operative_config",
                      "\n".join("    " + line for line in config.splitlines()))
    writer.flush()
  return path


def format_duration(seconds: float) -> str:
  """Formats seconds as `1h02m03s`, `2m03s` or `3s`."""
  seconds = int(round(seconds))
  hours, rest = divmod(seconds, 3600)
  minutes, seconds = divmod(rest, 60)
  if hours:
    return f"{hours}h{minutes:02d}m{seconds:02d}s"
  if minutes:
    return f"{minutes}m{seconds:02d}s"
  return f"{seconds}s"


def progress_line(step: int, train_steps: int, steps_per_second: float,
                  examples_per_second: float, loss: float,
                  eta_seconds: Optional[float]) -> str:
  """Returns the one-line training progress report."""
  eta = "?" if eta_seconds is None else format_duration(eta_seconds)
  loss_text = f"{loss:.4f}" if np.isfinite(loss) else str(loss)
  width = len(str(train_steps))
  return (f"train | step {step:{width}d}/{train_steps} | "
          f"{steps_per_second:7.1f} steps/s | "
          f"{examples_per_second:8.0f} examples/s | loss {loss_text} | "
          f"ETA {eta}")
