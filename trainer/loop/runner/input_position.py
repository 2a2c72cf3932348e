"""Where training is in its input, and how a restarted run finds it again.

The position is the checkpointed iterator where the pipeline can be saved;
else the batches consumed are skipped: one per step and worker, plus those
discarded after a non-finite loss, counted in `discarded_batches` (which is
checkpointed). Orbit keeps no input position of its own.
"""

from typing import Callable, Tuple

import tensorflow as tf

from trainer.data import inputs as inputs_lib


class InputPosition:
  """The batches discarded, and the way back to the saved place.

  Attributes:
    discarded_batches: Batches thrown away (after a non-finite loss), and
      the batches a change of batch size added to or took from the count of
      those read (`rebase`); checkpointed, so the input can be skipped to
      `global_step + discarded_batches` on resume.
    global_batch_size: The batch size the input is read in; checkpointed, so
      a run resumed with another one knows the size its checkpoint's input
      position counts in, whatever the configuration files in `model_dir`
      say (a run killed before its first save has written its own there).
  """

  def __init__(self, train_input: inputs_lib.DistributedInput,
               read_from: Callable[[tf.data.Dataset], None]):
    """Builds the position.

    Args:
      train_input: The training input.
      read_from: Makes training read the given dataset from here on.
    """
    self._input = train_input
    self._read_from = read_from
    self.discarded_batches = tf.Variable(0, dtype=tf.int64, trainable=False,
                                         name="discarded_batches")
    self.global_batch_size = tf.Variable(
        train_input.global_batch_size, dtype=tf.int64, trainable=False,
        name="global_batch_size")

  def restored(self) -> None:
    """After a restore: what is saved from here on is read in this run's
    batch size, not the checkpoint's."""
    self.global_batch_size.assign(self._input.global_batch_size)

  def resumption(self, input_position: str, num_workers: int) -> str:
    """Returns how a restarted run finds its place in the input.

    Args:
      input_position: `trainer.input_position`.
      num_workers: Workers reading the input; with several, the chief's
        checkpoint cannot hold every worker's iterator.

    Returns:
      "checkpoint" (checkpoint the training iterator), "workers" (each
      worker saves its iterator beside the checkpoint,
      `trainer.storage.worker_inputs`), "skip" (call `skip` with the
      restored step) or "restart".
    """
    if input_position != "checkpoint":
      return input_position
    if self._input.remote:
      # The service's batches come in no reproducible order: skipping would
      # read and drop as many through it without finding the saved place.
      return "restart"
    if self._input.checkpointable():
      return "checkpoint" if num_workers == 1 else "workers"
    # Some pipelines cannot be saved at all: skip what was consumed instead.
    return "skip"

  def skip(self, num_batches: int) -> int:
    """Restarts the input after its first `num_batches` batches and the
    discarded ones.

    Resumes the input position when the iterator is not in the checkpoint:
    each worker reads one batch per step, so skipping `global_step` batches
    of a deterministic pipeline (plus those discarded after a non-finite
    loss) puts it where the saved run was. The skipped batches are read and
    thrown away, so the cost grows with the step.

    Returns:
      The number of batches skipped.
    """
    num_batches += int(self.discarded_batches.numpy())
    if num_batches <= 0:
      return 0
    # A new dataset, not `self._input.dataset`: iterating a dataset again
    # advances the seed of `shuffle(reshuffle_each_iteration=True)`, which
    # would give another order than the saved run's (measured).
    self._read_from(self._input.build().skip(num_batches))
    return num_batches

  def rebase(self, iterator, step: int, batch_size: int,
             new_batch_size: int) -> Tuple[int, int]:
    """Moves `iterator`, at the start of the input, past the examples that
    batches of `batch_size` took up to `step`, in batches of
    `new_batch_size`: a resume with another batch size.

    Neither the checkpointed iterator (its batches have the old shape) nor
    a skip of `step` batches (of the new size) finds the saved place. The
    examples come in the same order whatever the batch, so skipping as many
    examples does, to within a batch: never an example not trained on yet.
    `discarded_batches` then counts the difference, so a later skip (a
    resume, a rollback) skips as many examples again.

    Returns:
      The batches skipped and the examples trained on before.
    """
    examples = (step + int(self.discarded_batches.numpy())) * batch_size
    batches = examples // new_batch_size
    _advance(iterator, tf.constant(batches, tf.int64))
    self.discarded_batches.assign(batches - step)
    return batches, examples

  def discard(self, iterator) -> None:
    """Reads the next batch of `iterator` and throws it away."""
    next(iterator)
    self.discarded_batches.assign_add(1)


@tf.function
def _advance(iterator, count: tf.Tensor) -> None:
  """Reads `count` batches of `iterator` and throws them away, in one call:
  a Python loop of `next` costs a call per batch."""
  for _ in tf.range(count):
    next(iterator)
