"""A training mixture's sources counted over a summary window.

Each step adds how many of its examples came from each source (the source
indices travel with the batch, `trainer.data.mixture`); the train summaries
read each source's share of the examples since the last summary as
`mixture/<name>` and reset the counts. Counted on the worker's whole batch,
before it is split over replicas, in one op a step.
"""

from typing import Callable, ContextManager, Dict

import tensorflow as tf

from trainer import graph_code
from trainer.data import mixture as mixture_lib


class SourceShares:
  """Examples per source since the last summary."""

  def __init__(self, mixture: mixture_lib.Mixture,
               host_scope: Callable[[], ContextManager]):
    """Builds the counts.

    Args:
      mixture: Names the sources, in the order of their indices.
      host_scope: Where variables live that steps add to in cross-replica
        context.
    """
    self._tags = list(mixture.tags().values())
    with host_scope():
      self._counts = tf.Variable(tf.zeros([len(self._tags)], tf.float64),
                                 trainable=False, name="source_counts")

  @graph_code.written_for_graphs
  def add(self, sources: tf.Tensor) -> tf.Tensor:
    """Adds a batch's source indices (shape `[batch]`); returns the counts."""
    counts = tf.math.bincount(sources, minlength=len(self._tags),
                              maxlength=len(self._tags), dtype=tf.float64)
    return self._counts.assign_add(counts)

  def read_and_reset(self) -> Dict[str, float]:
    """Returns each source's share of the examples counted (`mixture/<name>`
    -> share; 0 before any); resets the counts."""
    counts = self._counts.numpy()
    total = max(float(counts.sum()), 1.0)
    self._counts.assign(tf.zeros_like(self._counts))
    return {tag: float(count) / total
            for tag, count in zip(self._tags, counts)}
