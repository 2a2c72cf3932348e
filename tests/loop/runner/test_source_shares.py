"""A mixture's sources counted per summary window."""

import contextlib

import numpy as np
import tensorflow as tf

from trainer.data import mixture
from trainer.loop.runner import source_shares


def test_shares_are_the_window_s_counts_over_their_sum_then_reset():
  shares = source_shares.SourceShares(
      mixture.Mixture({"a": 1.0, "b": 1.0, "c": 0.0}),
      contextlib.nullcontext)
  assert shares.read_and_reset() == {"mixture/a": 0.0, "mixture/b": 0.0,
                                     "mixture/c": 0.0}
  add = tf.function(shares.add)
  add(tf.constant([0, 0, 0, 1], tf.int32))
  np.testing.assert_array_equal(add(tf.constant([1, 1, 0, 0], tf.int32)),
                                [5.0, 3.0, 0.0])
  assert shares.read_and_reset() == {"mixture/a": 0.625, "mixture/b": 0.375,
                                     "mixture/c": 0.0}
  add(tf.constant([2, 2], tf.int32))
  assert shares.read_and_reset() == {"mixture/a": 0.0, "mixture/b": 0.0,
                                     "mixture/c": 1.0}
