"""Streaming record files so that a resumed run continues exactly, from an
iterator state of kilobytes.

A shuffle buffer puts every element it holds into each checkpoint of the
iterator (a 10,000-image buffer of encoded ImageNet JPEGs is about a
gigabyte), and `experimental_symbolic_checkpoint` does not shrink it. This
pipeline holds no buffer across checkpoints; everything random in it is a
stateless function of a seed and a counter, so its state is a few positions:

  files     each epoch's files in a stateless permutation of `(seed, epoch)`,
            this input pipeline's share of them when there are several;
  records   read with a (sequential) interleave of `cycle_length` files: the
            files' byte offsets are the state;
  shuffle   each run of `window` consecutive examples permuted by a stateless
            shuffle seeded by the window's index: nothing crosses a window,
            so nothing is stored (`shuffle_windows`);
  seeds     each example numbered, for stateless augmentation seeds
            (`numbered`).

With `tf.data.Options().experimental_symbolic_checkpoint` (`resumable`) the
parallel stages' buffers are recomputed on restore instead of stored: a
TFRecord pipeline of 8 files through a 256-example window measured 17 KB of
state, against 821 KB for `shuffle(256)` over the same 3 KB records, with
the same next batches after a restore. The trade, measured in
docs/reliability.md ("What a shuffle buffer costs"): an example moves at most
`window` places, across files as far as the interleave mixes them, while the
file order changes every epoch.

A cost to know: symbolic checkpointing's bookkeeping grows with the file
ends a window crosses. Filling a window of 10,000 took 1.7 s over one file
of 1,024 records, 90 s over 625 passes of a 16-record file (fake data's
sizes; ImageNet's files hold about 1,250 records each). A restore reads the
window being served again (up to `window` records), whatever the step.
"""

from typing import Callable, Optional, Sequence, Tuple

import tensorflow as tf

from trainer import errors
from trainer.data import input_state

AUTOTUNE = tf.data.AUTOTUNE
# One input pipeline's worth of epochs, for `Dataset.range`: never reached.
_FOREVER = 1 << 62


def resumable(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """Turns on symbolic checkpointing: a saved iterator keeps positions, and
  recomputes on restore what prefetch, parallel map and interleave buffers
  held instead of storing it. (It does not shrink a `shuffle` buffer.)

  The framework does not turn it on for every pipeline: it slows some
  (measured on TensorFlow 2.20, batches/s with it over without: 0.70 for
  in-memory rows repeated and batched, 0.24 with a `shuffle` of 1,437 rows
  before, 0.25 for the shipped digits pipeline, 0.023 for the digits
  mixture), so a pipeline asks for it here, where its buffers are worth
  recomputing.

  Raises:
    errors.ConfigError: If the pipeline holds an op that TensorFlow cannot
      checkpoint symbolically (`input_state.symbolic_blocker`).
  """
  try:
    blocker = input_state.symbolic_blocker(dataset)
  except tf.errors.OpError:
    blocker = None  # Python state: no iterator of it is saved at all.
  if blocker is not None:
    # TensorFlow would say so at the first save, mid-run (or hang on the
    # restore, for a parallel interleave).
    raise errors.ConfigError(
        f"streaming.resumable: the pipeline holds {blocker}, which "
        f"TensorFlow {tf.__version__} cannot checkpoint symbolically; take "
        "it out, or leave out `resumable` (the iterator's buffers are then "
        "saved).")
  options = tf.data.Options()
  options.experimental_symbolic_checkpoint = True
  return dataset.with_options(options)


def epoch_seed(seed: int, counter: tf.Tensor) -> tf.Tensor:
  """The stateless seed (shape [2], int64) of `counter` under `seed`."""
  return tf.stack([tf.constant(seed, tf.int64), tf.cast(counter, tf.int64)])


def files_by_epoch(paths: Sequence[str], seed: int, shuffle: bool = True,
                   epochs: Optional[int] = None) -> tf.data.Dataset:
  """Returns the paths epoch after epoch; each epoch's order a stateless
  permutation of `(seed, epoch)` when `shuffle`, else as given.

  Args:
    paths: The files (at least one).
    seed: Seeds every epoch's order.
    shuffle: Permute each epoch; False keeps `paths`' order.
    epochs: How many epochs; None repeats for ever (the framework's own
      `repeat` then has nothing to add).

  Raises:
    errors.ConfigError: If `paths` is empty.
  """
  if not paths:
    raise errors.ConfigError("`files_by_epoch`: no files to read.")
  listed = tf.constant(list(paths), tf.string)

  def epoch_files(epoch):
    order = tf.range(tf.size(listed, out_type=tf.int64))
    if shuffle:
      order = tf.random.experimental.stateless_shuffle(
          order, seed=epoch_seed(seed, epoch))
    return tf.data.Dataset.from_tensor_slices(tf.gather(listed, order))

  return tf.data.Dataset.range(
      _FOREVER if epochs is None else epochs).flat_map(epoch_files)


def shuffle_windows(dataset: tf.data.Dataset, window: int,
                    seed: int) -> tf.data.Dataset:
  """Shuffles each run of `window` consecutive elements of `dataset`, by a
  stateless permutation of `(seed, window index)`.

  Unlike `shuffle(window)`, no element waits across a window, so a
  checkpoint of the iterator between two batches holds no example (with
  `resumable`): the window being served is read again on restore. An
  element moves at most `window - 1` places. A last window shorter than
  `window` is shuffled too.

  Args:
    dataset: Elements of any structure.
    window: Elements per window; 1 keeps the order.
    seed: Seeds the permutations.

  Raises:
    errors.ConfigError: If `window` is not a positive integer.
  """
  if not isinstance(window, int) or isinstance(window, bool) or window < 1:
    raise errors.ConfigError(
        f"the shuffle window ({window!r}) must be a positive integer of "
        "examples.")
  if window == 1:
    return dataset

  def permute(index, elements):
    count = tf.shape(tf.nest.flatten(elements)[0], out_type=tf.int64)[0]
    order = tf.random.experimental.stateless_shuffle(
        tf.range(count), seed=epoch_seed(seed, index))
    return tf.nest.map_structure(lambda part: tf.gather(part, order),
                                 elements)

  return (dataset.batch(window).enumerate()
          .map(permute, num_parallel_calls=AUTOTUNE).unbatch())


def numbered(dataset: tf.data.Dataset, seed: int) -> tf.data.Dataset:
  """Pairs each element with a distinct stateless seed (shape [2], int64)
  from `seed` and its index in the stream: `(seed, element)`. The index is
  a counter of the iterator's state, so a resumed run draws the same
  augmentation as an uninterrupted one."""
  return dataset.enumerate().map(
      lambda index, element: (epoch_seed(seed, index), element))


def share(paths: Sequence[str],
          input_context: Optional[tf.distribute.InputContext]
          ) -> Tuple[Sequence[str], Optional[Tuple[int, int]]]:
  """This input pipeline's files: every n-th (sorted) from its own index
  when there are at least as many files as pipelines. Otherwise all of them,
  and the `(count, index)` shard of examples the pipeline keeps instead."""
  paths = sorted(paths)
  pipelines = input_context.num_input_pipelines if input_context else 1
  if pipelines == 1:
    return paths, None
  index = input_context.input_pipeline_id
  if len(paths) >= pipelines:
    return paths[index::pipelines], None
  return paths, (pipelines, index)


def stream_files(paths: Sequence[str],
                 read: Callable[[tf.Tensor], tf.data.Dataset], *,
                 training: bool, seed: int = 0, window: int = 1024,
                 input_context: Optional[tf.distribute.InputContext] = None,
                 cycle_length: int = 16,
                 parse: Optional[Callable[..., object]] = None
                 ) -> tf.data.Dataset:
  """Returns this input pipeline's examples of record files, resumable
  exactly from an iterator state of kilobytes.

  Training reads every epoch's files in a new stateless order, for ever,
  and shuffles within windows of `window` examples; evaluation reads the
  files once, in order, unshuffled. Files are shared out among input
  pipelines (by example when there are fewer files than pipelines).

  Args:
    paths: The record files.
    read: Opens one file: `tf.data.TFRecordDataset`, say.
    training: Shuffled and repeated, or one pass in order.
    seed: Seeds the file orders and the windows.
    window: Examples per shuffle window (training).
    input_context: Which of how many input pipelines this is.
    cycle_length: Files read at once (the interleave's cycle).
    parse: Mapped over the records in parallel, before the shuffle (to
      shuffle parsed examples: a window holds what `parse` returns).

  Raises:
    errors.ConfigError: If `paths` is empty or `window` is not positive.
  """
  mine, by_example = share(paths, input_context)
  files = files_by_epoch(mine, seed, shuffle=training,
                         epochs=None if training else 1)
  # A sequential interleave: in TensorFlow 2.20 a *parallel* interleave
  # restored from a symbolic checkpoint often hangs on its next element (a
  # race: 15 of 19 tries here, at several positions, whatever
  # num_parallel_calls, 1 included). Reading records is cheap beside
  # parsing and decoding them, which `parse` and the Task's map do in
  # parallel (their symbolic restores were exact in every try).
  records = files.interleave(
      read, cycle_length=max(1, min(len(mine), cycle_length)))
  if by_example is not None:
    records = records.shard(*by_example)
  if parse is not None:
    records = records.map(parse, num_parallel_calls=AUTOTUNE,
                          deterministic=True)
  if training:
    records = shuffle_windows(records, window, seed)
  return resumable(records)
