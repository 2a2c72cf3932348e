"""`input_position`: how a restarted run finds its place in the input, and
the batches it skips."""

import pytest
import tensorflow as tf

from trainer.loop.runner import input_position


class _Input:
  """A training input of batches 0, 1, 2, ..."""

  def __init__(self, remote=False, checkpointable=True):
    self.remote = remote
    self.global_batch_size = 1
    self._checkpointable = checkpointable
    self.builds = 0

  def checkpointable(self):
    return self._checkpointable

  def build(self):
    self.builds += 1
    return tf.data.Dataset.range(100)


@pytest.mark.parametrize("setting, remote, checkpointable, workers, way", [
    ("checkpoint", False, True, 1, "checkpoint"),
    ("checkpoint", False, True, 2, "workers"),
    ("checkpoint", False, False, 2, "skip"),
    ("checkpoint", False, False, 1, "skip"),
    ("checkpoint", True, True, 1, "restart"),
    ("skip", False, True, 1, "skip"),
    ("restart", False, True, 1, "restart"),
])
def test_the_way_back_to_the_saved_place(setting, remote, checkpointable,
                                         workers, way):
  position = input_position.InputPosition(
      _Input(remote, checkpointable), lambda dataset: None)
  assert position.resumption(setting, workers) == way


def test_skipping_reads_a_new_pipeline_after_the_steps_and_discarded():
  read = []
  train_input = _Input()
  position = input_position.InputPosition(train_input, read.append)
  iterator = iter(train_input.build())
  position.discard(iterator)
  position.discard(iterator)
  assert int(next(iterator)) == 2  # Both were read and thrown away.
  assert int(position.discarded_batches.numpy()) == 2
  assert position.skip(5) == 7
  assert train_input.builds == 2 and len(read) == 1
  assert int(next(iter(read[0]))) == 7


def test_nothing_to_skip_keeps_the_pipeline():
  read = []
  position = input_position.InputPosition(_Input(), read.append)
  assert position.skip(0) == 0
  assert read == []


@pytest.mark.parametrize("discarded, batches, examples, first", [
    (0, 53, 640, 636),  # 10 steps of 64: 53 batches of 12, 4 read again.
    (2, 64, 768, 768),  # And 2 discarded batches of 64.
])
def test_a_new_batch_size_skips_the_examples_trained_on(
    discarded, batches, examples, first):
  position = input_position.InputPosition(_Input(), lambda dataset: None)
  position.discarded_batches.assign(discarded)
  iterator = iter(tf.data.Dataset.range(10000).batch(12))
  assert position.rebase(iterator, 10, 64, 12) == (batches, examples)
  # Never past an example not trained on yet.
  assert int(next(iterator)[0]) == first
  # A later skip (of steps at the new size) skips as many examples again.
  assert (10 + int(position.discarded_batches.numpy())) == batches
