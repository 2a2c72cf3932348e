"""trainer.data.streaming: record files read in stateless epoch orders,
shuffled within windows, resumed exactly from kilobytes of iterator state
(real TFRecord files, real checkpoints read back)."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from trainer import errors
from trainer.data import input_state
from trainer.data import streaming

RECORD_BYTES = 3000


@pytest.fixture(scope="module")
def record_files(tmp_path_factory):
  """8 files of 100 records: `(id, 3 KB of bytes)`, ids 1000 * file + i."""
  directory = tmp_path_factory.mktemp("records")
  rng = np.random.RandomState(0)
  paths = []
  for file in range(8):
    path = str(directory / f"part-{file}.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
      for i in range(100):
        writer.write(tf.train.Example(features=tf.train.Features(feature={
            "id": tf.train.Feature(int64_list=tf.train.Int64List(
                value=[1000 * file + i])),
            "payload": tf.train.Feature(bytes_list=tf.train.BytesList(
                value=[rng.bytes(RECORD_BYTES)])),
        })).SerializeToString())
    paths.append(path)
  return paths


def _parse(record):
  example = tf.io.parse_single_example(record, {
      "id": tf.io.FixedLenFeature([], tf.int64),
      "payload": tf.io.FixedLenFeature([], tf.string)})
  return example["id"], example["payload"]


def _stream(paths, training=True, window=256, seed=3, context=None):
  return streaming.stream_files(paths, tf.data.TFRecordDataset,
                                training=training, seed=seed, window=window,
                                input_context=context, parse=_parse)


def _ids(dataset, count):
  return [int(i) for i, _ in dataset.take(count).as_numpy_iterator()]


def test_each_epoch_is_a_new_stateless_permutation_of_the_files():
  paths = [f"f{i}" for i in range(6)]
  epochs = [[p.decode() for p in streaming.files_by_epoch(
      paths, seed=7, epochs=3).as_numpy_iterator()][6 * e:6 * e + 6]
            for e in range(3)]
  assert all(sorted(epoch) == paths for epoch in epochs)
  assert len({tuple(epoch) for epoch in epochs}) == 3  # Each epoch anew.
  again = [p.decode() for p in streaming.files_by_epoch(
      paths, seed=7, epochs=3).as_numpy_iterator()]
  assert again == sum(epochs, [])  # The same for the same seed.
  assert [p.decode() for p in streaming.files_by_epoch(
      paths, seed=7, shuffle=False, epochs=1).as_numpy_iterator()] == paths
  with pytest.raises(errors.ConfigError, match="no files"):
    streaming.files_by_epoch([], seed=0)


def test_a_window_is_a_permutation_of_its_own_elements_only():
  shuffled = list(streaming.shuffle_windows(
      tf.data.Dataset.range(1000), 64, seed=1).as_numpy_iterator())
  for start in range(0, 1000, 64):
    window = shuffled[start:start + 64]
    assert sorted(window) == list(range(start, min(start + 64, 1000)))
  assert shuffled != list(range(1000))
  moved = [abs(position - value) for position, value in enumerate(shuffled)]
  assert max(moved) < 64 and np.mean(moved) > 10
  assert list(streaming.shuffle_windows(
      tf.data.Dataset.range(5), 1, seed=1).as_numpy_iterator()) == list(
          range(5))
  for window in (0, -3, 2.5, True):
    with pytest.raises(errors.ConfigError, match="positive integer"):
      streaming.shuffle_windows(tf.data.Dataset.range(5), window, seed=1)


def test_training_reads_every_record_once_an_epoch_in_a_new_order(
    record_files):
  ids = _ids(_stream(record_files), 1600)
  first, second = ids[:800], ids[800:]
  # Windows of 256 straddle the epoch's end: compare the epochs' middles.
  assert sorted(first[:512]) != sorted(second[:512])
  counts = collections.Counter(ids)
  assert set(counts) == {1000 * f + i for f in range(8) for i in range(100)}
  assert max(counts.values()) <= 3
  assert ids == _ids(_stream(record_files), 1600)  # Deterministic.
  assert ids != _ids(_stream(record_files, seed=4), 1600)
  # Evaluation: one pass, unshuffled: the files' records interleaved in
  # turn (a cycle of all 8 files), the same every time.
  evaluated = _ids(_stream(record_files, training=False), 10000)
  assert evaluated == [1000 * f + i for i in range(100) for f in range(8)]


def test_a_restored_iterator_continues_exactly_from_kilobytes(
    record_files, tmp_path):
  # Positions inside the first epoch, across its end, and into the second
  # (800 records an epoch, windows of 1,000 straddling it).
  for position in (3, 12, 26, 37):
    batches = _stream(record_files, window=1000).batch(32).prefetch(2)
    iterator = iter(batches)
    for _ in range(position):
      next(iterator)
    prefix = tf.train.Checkpoint(iterator=iterator).write(
        str(tmp_path / f"streamed-{position}"))
    expected = [next(iterator)[0].numpy() for _ in range(40)]
    restored = iter(_stream(record_files, window=1000).batch(32).prefetch(2))
    tf.train.Checkpoint(iterator=restored).read(prefix).assert_consumed()
    for want in expected:
      np.testing.assert_array_equal(next(restored)[0].numpy(), want)
    state = input_state.checkpoint_bytes(prefix)
    assert 0 < state < 64 * 1024, (position, state)

  # A shuffle buffer of the same 1,000 records: the checkpoint holds them.
  buffered = iter(tf.data.TFRecordDataset(record_files).map(_parse).shuffle(
      1000, seed=3).repeat().batch(32).prefetch(2))
  for _ in range(37):
    next(buffered)
  prefix = tf.train.Checkpoint(iterator=buffered).write(
      str(tmp_path / "buffered"))
  assert input_state.checkpoint_bytes(prefix) > 1000 * RECORD_BYTES / 2


def test_pipelines_share_files_or_examples_without_overlap(record_files):
  def context(index, count):
    return tf.distribute.InputContext(num_input_pipelines=count,
                                      input_pipeline_id=index)

  for count in (2, 3):  # By file (8 files), not evenly for 3.
    parts = [set(_ids(_stream(record_files, training=False,
                              context=context(i, count)), 10000))
             for i in range(count)]
    assert sum(map(len, parts)) == 800 and set.union(*parts) == set(
        _ids(_stream(record_files, training=False), 10000))
    assert all({i // 1000 for i in part}.isdisjoint({j // 1000 for j in other})
               for part in parts for other in parts if part is not other)
  # Fewer files than pipelines: every pipeline reads the file, keeping its
  # own examples.
  parts = [_ids(_stream(record_files[:1], training=False,
                        context=context(i, 2)), 10000) for i in range(2)]
  assert parts == [list(range(0, 100, 2)), list(range(1, 100, 2))]
  mine, by_example = streaming.share(record_files[:1], context(1, 2))
  assert mine == record_files[:1] and by_example == (2, 1)
  assert streaming.share(record_files, context(1, 3)) == (
      sorted(record_files)[1::3], None)


def test_numbered_gives_each_element_its_own_seed():
  seeds = [tuple(seed) for seed, _ in streaming.numbered(
      tf.data.Dataset.range(4), seed=9).as_numpy_iterator()]
  assert seeds == [(9, 0), (9, 1), (9, 2), (9, 3)]


def test_the_option_is_on_in_what_stream_files_returns(record_files):
  options = _stream(record_files).batch(4).options()
  assert options.experimental_symbolic_checkpoint is True

