"""TensorBoard summaries: a lazily made writer, scalars, images and the
operative gin config."""

import contextlib
import functools
import os
from typing import (Callable, Dict, Mapping, Optional, Sequence, Tuple,
                    Union)

import gin
import numpy as np
import orbit
import tensorflow as tf

from trainer.storage import files

OPERATIVE_CONFIG_FILE = "operative_config.gin"


class LazyWriter:
  """A summary writer for `log_dir`, created when first written to.

  `tf.summary.create_file_writer` creates an event file at once; a run
  that stops before its first summary (a bad checkpoint, a bad setting)
  must leave `model_dir` as it found it.

  That call also makes `log_dir` and every missing folder above it: a
  writer first used after the user deleted `model_dir` under the run would
  make it again, and the run would go on writing into it. Given
  `model_dir`, such a writer writes nothing instead; the next checkpoint
  save stops the run, saying `model_dir` was deleted. (A writer already
  made does not make anything again: its summaries go nowhere.)
  """

  def __init__(self, log_dir: str, model_dir: Optional[str] = None):
    """Names the writer's folder.

    Args:
      log_dir: Where the event file goes.
      model_dir: The run's folder, which holds `log_dir` and must not be
        made again; None: `log_dir` is made wherever missing.
    """
    self.log_dir = log_dir
    self._model_dir = model_dir
    self._writer = None

  def as_default(self, step: Optional[int] = None):
    return self._get().as_default(step=step)

  def flush(self) -> None:
    if self._writer is not None:
      self._writer.flush()

  def create(self) -> None:
    """Makes the writer and its event file, for results written to it."""
    self._get()

  def _get(self) -> tf.summary.SummaryWriter:
    if self._writer is None:
      if files.directory_gone(self._model_dir):
        self._writer = tf.summary.create_noop_writer()
      else:
        # A deletion between this check and the writer's own `makedirs`
        # still makes `log_dir` again: the window is one call long.
        self._writer = tf.summary.create_file_writer(self.log_dir)
    return self._writer


class _RootWriter(LazyWriter):
  """The root writer of named runs: `as_default` sets no default writer
  until `create` has made its file.

  Summaries a Task writes itself while a named set is evaluated
  (`tf.summary` in `validation_step`) are not recorded: return them as
  metrics, which go to the set's run.
  """

  def as_default(self, step: Optional[int] = None):
    if self._writer is None:
      return contextlib.nullcontext()
    return self._writer.as_default(step=step)


class RunsSummaryManager(orbit.utils.SummaryManager):
  """Orbit's summary manager (scalars at the global step) whose writers
  are `LazyWriter`s, and which writes a result named `<run>/<tag>`, for
  each of `runs`, as `tag` in its own TensorBoard run, `summary_dir/<run>`:
  the same tag of every run in one chart, one curve a run (named
  evaluation sets: `eval/clean`, `eval/noisy`). Other results go to
  `summary_dir` itself."""

  def __init__(self, summary_dir: str, runs: Sequence[str],
               global_step: tf.Variable, model_dir: Optional[str] = None):
    """Builds the manager.

    Args:
      summary_dir: The root run's folder.
      runs: The names whose results get a run of their own; () for none.
      global_step: The step summaries are written at.
      model_dir: The run's folder, not made again once deleted
        (`LazyWriter`).
    """
    super().__init__(summary_dir, tf.summary.scalar, global_step=global_step)
    self._runs = tuple(runs)
    self._model_dir = model_dir

  def summary_writer(self, relative_path: str = "") -> LazyWriter:
    """Returns the writer of `summary_dir/relative_path`, whose event file
    is made at its first summary.

    With `runs`, the root's is the default writer while the sets are
    evaluated, and makes no file for that alone (`_RootWriter`): every
    result is a set's, so `eval/` holds the sets' runs and no empty event
    file beside them. Without, summaries a Task writes itself in
    `validation_step` go to the root's.
    """
    if relative_path not in self._summary_writers:
      kind = (_RootWriter if relative_path == "" and self._runs
              else LazyWriter)
      self._summary_writers[relative_path] = kind(
          os.path.join(self._summary_dir, relative_path), self._model_dir)
    return self._summary_writers[relative_path]

  def write_summaries(self, summary_dict: Mapping[str, object]) -> None:
    nested = by_run(summary_dict, self._runs)
    root = {name: value for name, value in nested.items()
            if not isinstance(value, dict)}
    if root:  # Results that are no set's (`steps_per_second`).
      self.summary_writer().create()
    super().write_summaries(nested)

  def flush(self) -> None:
    for writer in self._summary_writers.values():
      writer.flush()


def by_run(results: Mapping[str, object], runs: Sequence[str]
           ) -> Dict[str, object]:
  """`{"clean/accuracy": a, "steps_per_second": s}` -> `{"clean":
  {"accuracy": a}, "steps_per_second": s}` for `runs` ("clean"): the nested
  form Orbit's summary manager writes one run (subdirectory) a key of."""
  nested: Dict[str, object] = {}
  for name, value in results.items():
    run, _, tag = name.partition("/")
    if tag and run in runs:
      nested.setdefault(run, {})[tag] = value
    else:
      nested[name] = value
  return nested


# What summaries are written through.
Writer = Union[tf.summary.SummaryWriter, LazyWriter]


class ScalarWriter:
  """Writes scalar summaries to a writer, each set of names in one call of a
  function traced for them.

  An eager `tf.summary.scalar` runs several ops: seven scalars took 1.5 ms
  eager and 0.35 ms through one traced call (measured), and the train
  summaries are written after every loop at `steps_per_loop` =
  `summary_interval`.
  """

  def __init__(self, writer: Writer):
    self._writer = writer
    self._functions: Dict[Tuple[str, ...], Callable] = {}

  def write(self, scalars: Mapping[str, object], step: int,
            flush: bool = True) -> None:
    """Writes each value of `scalars` (a number) as a scalar summary at
    `step`."""
    names = tuple(scalars)
    if names not in self._functions:
      self._functions[names] = tf.function(functools.partial(
          _write_scalars, names))
    values = tf.constant([float(value) for value in scalars.values()],
                         tf.float64)
    # The writer is entered here, not in the function: a `LazyWriter`
    # makes its file on first use, which a trace must not do.
    with self._writer.as_default():
      self._functions[names](values, tf.constant(step, tf.int64))
    if flush:
      self._writer.flush()


def _write_scalars(names: Tuple[str, ...], values: tf.Tensor,
                   step: tf.Tensor) -> None:
  for index, name in enumerate(names):
    tf.summary.scalar(name, values[index], step=step)


def write_images(log_dir: str, images: Mapping[str, np.ndarray],
                 step: int, model_dir: Optional[str] = None) -> None:
  """Writes each image (`[height, width, channels]`, values in [0, 1]) as
  an image summary in `log_dir` and as `log_dir/images/<name>-<step>.png`;
  nothing where `model_dir` (the run's, holding `log_dir`) was deleted."""
  if not images or files.directory_gone(model_dir):
    return
  writer = tf.summary.create_file_writer(log_dir)
  with writer.as_default(step=step):
    for name, image in images.items():
      tf.summary.image(name, image[None], step=step)
  writer.close()
  for name, image in images.items():
    png = tf.io.encode_png(tf.cast(tf.round(tf.clip_by_value(
        tf.convert_to_tensor(image, tf.float32), 0.0, 1.0) * 255), tf.uint8))
    files.write_bytes(os.path.join(
        log_dir, "images", f"{name.replace('/', '_')}-{step}.png"),
                      png.numpy(), root=model_dir)


def write_operative_config(directory: str,
                           writer: Optional[Writer],
                           step: int) -> Optional[str]:
  """Saves the gin parameters actually used, as a file and a text summary.

  Returns:
    The path of the written `operative_config.gin`; None where `directory`
    (the run's `model_dir`) was deleted under the run, before or during
    the write: nothing is written, nor is it made again.
  """
  config = gin.operative_config_str()
  path = os.path.join(directory, OPERATIVE_CONFIG_FILE)
  if not files.write_text(path, config, root=directory):
    return None
  if writer is not None:
    with writer.as_default(step=step):
      # Indented lines render as a code block in TensorBoard's markdown.
      tf.summary.text("operative_config",
                      "\n".join("    " + line for line in config.splitlines()))
    writer.flush()
  return path
