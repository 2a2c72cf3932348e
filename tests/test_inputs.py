"""Batching per replica, the split over replicas, checkpointable input."""

import numpy as np
import pytest
import tensorflow as tf

from trainer import errors
from trainer import inputs


def _mirrored():
  return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def _numbers(count):
  return lambda context: tf.data.Dataset.range(count)


def test_per_replica_batch_size():
  assert inputs.per_replica_batch_size(64, 2) == 32
  with pytest.raises(errors.ConfigError,
                     match=r"^`trainer.global_batch_size` \(33\) must be "
                     r"divisible by the number of replicas \(2\)\.$"):
    inputs.per_replica_batch_size(33, 2, "trainer.global_batch_size")
  with pytest.raises(errors.ConfigError, match="must be positive"):
    inputs.per_replica_batch_size(0, 1)


def test_training_batches_are_split_into_disjoint_replica_slices():
  strategy = _mirrored()
  data = inputs.DistributedInput(strategy, _numbers(40), 8, training=True)
  assert data.per_replica_batch_size == 4
  iterator = iter(data.dataset)

  @tf.function
  def step():
    values = data.split(next(iterator))
    return strategy.run(lambda x: tf.identity(x), args=(values,))

  seen = []
  for _ in range(6):  # 48 examples: the 40 repeat, no partial batch.
    first, second = strategy.experimental_local_results(step())
    assert first.shape == second.shape == (4,)
    seen.extend(first.numpy().tolist() + second.numpy().tolist())
  assert seen[:40] == list(range(40))
  assert seen[40:] == list(range(8))


def test_eval_keeps_the_partial_last_batch_once():
  strategy = _mirrored()
  data = inputs.DistributedInput(strategy, _numbers(21), 8, training=False)
  sizes, seen = [], []
  for batch in data.dataset:
    parts = strategy.experimental_local_results(data.split(batch))
    sizes.append([int(p.shape[0]) for p in parts])
    seen.extend(np.concatenate([p.numpy() for p in parts]).tolist())
  assert sizes == [[4, 4], [4, 4], [4, 1]]
  assert seen == list(range(21))


def test_one_replica_gets_the_whole_batch():
  strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
  data = inputs.DistributedInput(strategy, _numbers(10), 5, training=True)
  batch = next(iter(data.dataset))
  assert data.split(batch) is batch


def test_dataset_fn_must_return_a_dataset():
  with pytest.raises(TypeError, match="must return a `tf.data.Dataset`"):
    inputs.DistributedInput(_mirrored(), lambda context: [1, 2], 2, True)


def test_is_checkpointable():
  assert inputs.is_checkpointable(tf.data.Dataset.range(3).shuffle(3))
  from_python = tf.data.Dataset.from_generator(
      lambda: iter(range(3)), output_signature=tf.TensorSpec((), tf.int64))
  assert not inputs.is_checkpointable(from_python)


def test_private_thread_pool_is_applied():
  strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
  data = inputs.DistributedInput(strategy, _numbers(10), 5, training=True,
                                 private_threads=3)
  assert data.dataset.options().threading.private_threadpool_size == 3
  assert next(iter(data.dataset)).numpy().tolist() == [0, 1, 2, 3, 4]
