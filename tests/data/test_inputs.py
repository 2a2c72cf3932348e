"""Batching per replica, the split over replicas, checkpointable input."""

import numpy as np
import pytest
import tensorflow as tf

from trainer import errors
from trainer.data import input_state
from trainer.data import inputs


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
  # The partial last batch of 5 is split as evenly as it goes.
  assert sizes == [[4, 4], [4, 4], [3, 2]]
  assert seen == list(range(21))
  # Of unknown size, it may.
  unknown = inputs.DistributedInput(
      strategy, lambda ctx: _numbers(21)(ctx).filter(lambda x: True), 8,
      training=False)
  assert unknown.may_leave_replicas_empty


@pytest.mark.parametrize("count, last", [(201, [5, 4]), (129, [1, 0]),
                                         (1, [1, 0]), (192, [32, 32])])
def test_a_partial_eval_batch_is_split_as_evenly_as_it_goes(count, last):
  strategy = _mirrored()
  data = inputs.DistributedInput(strategy, _numbers(count), 64,
                                 training=False)
  # Only a last batch smaller than the replica count leaves one empty.
  assert data.may_leave_replicas_empty == (0 in last)
  sizes, seen = [], []

  @tf.function
  def step(batch):  # In a graph, where the batch's size is a tensor.
    return strategy.run(tf.identity, args=(data.split(batch),))

  for batch in data.dataset:
    parts = strategy.experimental_local_results(step(batch))
    sizes.append([int(p.shape[0]) for p in parts])
    seen.extend(np.concatenate([p.numpy() for p in parts]).tolist())
  assert sizes[:-1] == [[32, 32]] * (len(sizes) - 1)
  assert sizes[-1] == last
  assert seen == list(range(count))


def test_training_slices_keep_a_static_shape():
  strategy = _mirrored()
  data = inputs.DistributedInput(strategy, _numbers(40), 8, training=True)
  assert not data.may_leave_replicas_empty
  shapes = []

  @tf.function
  def step(batch):
    values = data.split(batch)
    shapes.extend(v.shape for v in strategy.experimental_local_results(values))
    return strategy.run(tf.identity, args=(values,))

  step(next(iter(data.dataset)))
  assert shapes == [tf.TensorShape([4]), tf.TensorShape([4])]


def test_one_replica_gets_the_whole_batch():
  strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
  data = inputs.DistributedInput(strategy, _numbers(10), 5, training=True)
  batch = next(iter(data.dataset))
  assert data.split(batch) is batch


def test_dataset_fn_must_return_a_dataset():
  with pytest.raises(errors.ConfigTypeError) as raised:
    inputs.DistributedInput(_mirrored(), lambda context: [1, 2], 2, True)
  assert str(raised.value) == (
      "`build_inputs` must return a `tf.data.Dataset`, got list.")
  # Code that caught the `TypeError` this was still catches it.
  assert isinstance(raised.value, TypeError)


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


def _ops(dataset):
  """The op names in `dataset`'s graph."""
  graph = tf.compat.v1.GraphDef.FromString(
      dataset._as_serialized_graph().numpy())  # pylint: disable=protected-access
  return {node.op for node in graph.node}


def _shuffled_epochs(count):
  """Endless blocks, each a seeded permutation of `range(count)`."""
  return tf.data.Dataset.counter().map(
      lambda epoch: tf.random.experimental.stateless_shuffle(
          tf.range(count, dtype=tf.int64),
          tf.stack([tf.constant(3, tf.int64), epoch])))


def test_blocks_are_batched_a_block_at_a_time_like_their_examples():
  strategy = _mirrored()
  data = inputs.DistributedInput(
      strategy, lambda context: inputs.examples_from_blocks(
          _shuffled_epochs(10)), 8, training=True)
  assert "RebatchDatasetV2" in _ops(data.dataset)
  assert "BatchDatasetV2" not in _ops(data.dataset)
  expected = _shuffled_epochs(10).unbatch().batch(8)
  batches = [b.tolist() for b in data.dataset.take(5).as_numpy_iterator()]
  assert batches == [b.tolist() for b in expected.take(5).as_numpy_iterator()]
  # Batches run across epochs, each epoch a permutation of its own.
  flat = sum(batches, [])
  assert [sorted(flat[i:i + 10]) for i in range(0, 40, 10)] == [
      list(range(10))] * 4
  assert flat[:10] != flat[10:20]

  evaluation = inputs.DistributedInput(
      strategy, lambda context: inputs.examples_from_blocks(
          tf.data.Dataset.from_tensors(tf.range(21, dtype=tf.int64))),
      8, training=False)
  assert [b.tolist() for b in evaluation.dataset.as_numpy_iterator()] == [
      list(range(0, 8)), list(range(8, 16)), list(range(16, 21))]


def test_blocks_input_resumes_exactly_from_a_checkpoint(tmp_path):
  strategy = tf.distribute.OneDeviceStrategy("/cpu:0")

  def build():
    return inputs.DistributedInput(
        strategy, lambda context: inputs.examples_from_blocks(
            _shuffled_epochs(10)), 4, training=True,
        batch_fn=lambda batch, seed: (batch, seed)).dataset

  straight = [(b.tolist(), s.tolist())
              for b, s in build().take(12).as_numpy_iterator()]
  iterator = iter(build())
  first = [next(iterator) for _ in range(5)]
  path = tf.train.Checkpoint(iterator=iterator).write(str(tmp_path / "ckpt"))
  restored = iter(build())
  tf.train.Checkpoint(iterator=restored).read(path).assert_consumed()
  resumed = first + [next(restored) for _ in range(7)]
  assert [(b.numpy().tolist(), s.numpy().tolist())
          for b, s in resumed] == straight


def test_sharded_examples_are_batched_an_example_at_a_time():
  data = inputs.DistributedInput(
      tf.distribute.OneDeviceStrategy("/cpu:0"),
      lambda context: inputs.examples_from_blocks(
          tf.data.Dataset.from_tensors(tf.range(12, dtype=tf.int64))),
      3, training=True)
  dataset = data.build(lambda examples: examples.shard(2, 1))
  assert "RebatchDatasetV2" not in _ops(dataset)
  assert [b.tolist() for b in dataset.take(3).as_numpy_iterator()] == [
      [1, 3, 5], [7, 9, 11], [1, 3, 5]]


@pytest.mark.parametrize("parallel_calls,op", [
    (0, "MapDataset"), (-1, "ParallelMapDatasetV2"),
    (2, "ParallelMapDatasetV2")])
def test_batch_fn_runs_in_the_prefetch_thread_unless_told(parallel_calls, op):
  data = inputs.DistributedInput(
      tf.distribute.OneDeviceStrategy("/cpu:0"), _numbers(10), 5,
      training=True, batch_fn=lambda batch, seed: batch * 2,
      batch_fn_parallel_calls=parallel_calls)
  ops = _ops(data.dataset)
  assert op in ops
  assert ("ParallelMapDatasetV2" in ops) == (parallel_calls != 0)
  assert [b.tolist() for b in data.dataset.take(3).as_numpy_iterator()] == [
      [0, 2, 4, 6, 8], [10, 12, 14, 16, 18], [0, 2, 4, 6, 8]]


def test_examples_from_arrays_shards_and_shuffles_each_epoch():
  arrays = (np.arange(10), np.arange(10) * 10)
  context = tf.distribute.InputContext(num_input_pipelines=2,
                                       input_pipeline_id=1)
  evaluation = inputs.examples_from_arrays(arrays, False, context)
  assert [(int(x), int(y)) for x, y in evaluation] == [
      (1, 10), (3, 30), (5, 50), (7, 70), (9, 90)]
  training = inputs.examples_from_arrays(arrays, True, None, seed=3)
  epochs = [[int(x) for x, _ in training] for _ in range(2)]
  assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(10))
  assert epochs[0] != epochs[1]  # Reshuffled.
  again = inputs.examples_from_arrays(arrays, True, None, seed=3)
  assert [int(x) for x, _ in again] == epochs[0]  # Seeded.


def test_shuffled_indices_are_a_new_permutation_every_epoch():
  indices = inputs.shuffled_indices(10, seed=3)
  stream = [int(index) for index in indices.take(30)]
  epochs = [stream[start:start + 10] for start in (0, 10, 20)]
  assert all(sorted(epoch) == list(range(10)) for epoch in epochs)
  assert len({tuple(epoch) for epoch in epochs}) == 3
  assert stream == [int(index) for index in
                    inputs.shuffled_indices(10, seed=3).take(30)]
  assert stream != [int(index) for index in
                    inputs.shuffled_indices(10, seed=4).take(30)]
  assert list(inputs.shuffled_indices(0, seed=3)) == []


def test_shuffled_indices_are_batched_by_a_counter_and_saved_by_it(
    tmp_path):
  """The framework's batches are the stream's indices in order (batches
  across epoch ends included); the iterator is saved symbolically, a few
  hundred bytes, and restores to the same next batches."""
  strategy = tf.distribute.OneDeviceStrategy("/cpu:0")

  def build():
    return inputs.DistributedInput(
        strategy, lambda context: inputs.shuffled_indices(10, seed=3), 4,
        training=True, batch_fn=lambda batch, seed: (batch, seed)).dataset

  stream = [int(index) for index in
            inputs.shuffled_indices(10, seed=3).take(48)]
  dataset = build()
  assert dataset.options().experimental_symbolic_checkpoint is True
  straight = [(b.tolist(), s.tolist())
              for b, s in dataset.take(12).as_numpy_iterator()]
  assert [index for batch, _ in straight for index in batch] == stream
  iterator = iter(build())
  first = [next(iterator) for _ in range(5)]
  path = tf.train.Checkpoint(iterator=iterator).write(str(tmp_path / "ckpt"))
  assert input_state.checkpoint_bytes(path) < 4096
  restored = iter(build())
  tf.train.Checkpoint(iterator=restored).read(path).assert_consumed()
  resumed = first + [next(restored) for _ in range(7)]
  assert [(b.numpy().tolist(), s.numpy().tolist())
          for b, s in resumed] == straight
