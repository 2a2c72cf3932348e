"""A training mixture's sources counted over a summary window, and their
losses.

Each step adds how many of its examples came from each source (the source
indices travel with the batch, `trainer.data.mixture`) and, where the
Task's `train_step` returns its per-example losses
(`gradients.PER_EXAMPLE_LOSS`, as the default step does when asked), the
sum of each source's losses. The train summaries read each source's share
of the examples since the last summary as `mixture/<name>` and its mean
per-example loss as `mixture/<name>/loss`, and reset the sums. Counted on
the worker's whole batch, in one variable update a step.
"""

from typing import Callable, ContextManager, Dict, Optional

import tensorflow as tf

from trainer import errors
from trainer import graph_code
from trainer.data import mixture as mixture_lib
from trainer.model import gradients


class SourceShares:
  """Examples and the sum of their losses per source since the last summary.

  Attributes:
    reports_losses: Whether the step returns per-example losses (set when it
      is first traced).
  """

  def __init__(self, mixture: mixture_lib.Mixture,
               host_scope: Callable[[], ContextManager]):
    """Builds the sums.

    Args:
      mixture: Names the sources, in the order of their indices.
      host_scope: Where variables live that steps add to in cross-replica
        context.
    """
    self._tags = list(mixture.tags().values())
    # Row 0 counts each source's examples, row 1 sums their losses: one
    # update a step.
    with host_scope():
      self._sums = tf.Variable(tf.zeros([2, len(self._tags)], tf.float64),
                               trainable=False, name="source_counts")
    self.reports_losses = False

  @graph_code.written_for_graphs
  def add(self, sources: tf.Tensor,
          losses: Optional[tf.Tensor] = None) -> tf.Tensor:
    """Adds a batch's source indices (shape `[batch]`) and, where given, the
    losses of the same examples in the same order (float64, `[batch]`);
    returns the sums, `[counts, loss sums]`."""
    size = len(self._tags)
    counts = tf.math.bincount(sources, minlength=size, maxlength=size,
                              dtype=tf.float64)
    if losses is None:
      sums = tf.zeros([size], tf.float64)
    else:
      self.reports_losses = True
      sums = tf.math.unsorted_segment_sum(losses, sources, size)
    return self._sums.assign_add(tf.stack([counts, sums]))

  def read_and_reset(self) -> Dict[str, float]:
    """Returns each source's share of the examples counted (`mixture/<name>`
    -> share; 0 before any) and, where the step reports per-example losses,
    the mean loss of its examples (`mixture/<name>/loss`; none for a source
    without examples since the last summary); resets the sums."""
    counts, losses = self._sums.numpy()
    total = max(float(counts.sum()), 1.0)
    self._sums.assign(tf.zeros_like(self._sums))
    results = {tag: float(count) / total
               for tag, count in zip(self._tags, counts)}
    if self.reports_losses:
      results.update({f"{tag}/loss": float(loss) / float(count)
                      for tag, count, loss in zip(self._tags, counts, losses)
                      if count > 0})
    return results


@graph_code.written_for_graphs
def worker_losses(strategy: tf.distribute.Strategy, per_example_loss,
                  batch_size: int, task_name: str) -> tf.Tensor:
  """Returns the per-example losses of every local replica, in the order of
  the worker's batch, as float64 `[batch]`.

  `DistributedInput.split` gives local replica i the i-th slice of the
  worker's batch, and the local results come in replica order: so the
  replicas' losses, concatenated, line up with the worker batch's source
  indices, with no split of the indices and no op per replica.

  Args:
    strategy: Ran the step.
    per_example_loss: What the step returned as `PER_EXAMPLE_LOSS`.
    batch_size: The examples of a replica's batch.
    task_name: The Task's class name, for the error.

  Raises:
    errors.ConfigError: If a replica's losses are not one per example.
  """
  local = strategy.experimental_local_results(per_example_loss)
  for losses in local:
    shape = getattr(losses, "shape", tf.TensorShape(None))
    if not (shape.rank == 1 and shape.is_compatible_with([batch_size])):
      raise errors.ConfigError(
          f"{task_name}.train_step returned `{gradients.PER_EXAMPLE_LOSS}` "
          f"of shape {shape}: it must hold one loss per example of the "
          f"replica's batch, shape [{batch_size}].")
  return tf.concat([tf.cast(losses, tf.float64) for losses in local], 0)
