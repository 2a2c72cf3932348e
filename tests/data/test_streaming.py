"""trainer.data.streaming: record files read in stateless epoch orders,
shuffled within windows, resumed exactly from kilobytes of iterator state
(real TFRecord files, real checkpoints read back)."""

import collections
import os
import subprocess
import sys

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



def test_a_mixture_of_two_streamed_sources_restores_exactly_from_kilobytes(
    record_files, tmp_path):
  """tf.data's own sampling (`trainer.mixture`) over two file sources: the
  sources' positions and the draw's counter are the whole state."""
  from trainer.data import inputs  # pylint: disable=g-import-not-at-top
  from trainer.data import mixture  # pylint: disable=g-import-not-at-top

  def build():
    return inputs.DistributedInput(
        tf.distribute.get_strategy(),
        lambda context: {"a": _stream(record_files[:4], window=300, seed=1),
                         "b": _stream(record_files[4:], window=300, seed=2)},
        32, training=True,
        mixture=mixture.Mixture({"a": 0.75, "b": 0.25}, seed=0)).dataset

  iterator = iter(build())
  for _ in range(30):  # Past the first epoch of "a" (400 records).
    next(iterator)
  prefix = tf.train.Checkpoint(iterator=iterator).write(
      str(tmp_path / "mixed"))
  expected = [tf.nest.map_structure(lambda t: t.numpy(), next(iterator))
              for _ in range(20)]
  restored = iter(build())
  tf.train.Checkpoint(iterator=restored).read(prefix).assert_consumed()
  for want in expected:
    got = tf.nest.map_structure(lambda t: t.numpy(), next(restored))
    tf.nest.map_structure(np.testing.assert_array_equal, got, want)
  ids = np.concatenate([batch[0][0] for batch in expected])
  # Both sources drawn, about 3 to 1 (ids below 4000 are source "a"'s).
  assert 0.6 < np.mean(ids < 4000) < 0.9
  state = input_state.checkpoint_bytes(prefix)
  assert 0 < state < 64 * 1024, state


_STREAMED_TASK_MODULE = '''
import gin
import numpy as np
import tensorflow as tf
import tf_keras
import trainer
from trainer.data import streaming

FEATURES = {"x": tf.io.FixedLenFeature([4], tf.float32),
            "y": tf.io.FixedLenFeature([1], tf.float32)}


def write(directory, name, files, per_file, shift, seed):
  rng = np.random.RandomState(seed)
  for index in range(files):
    with tf.io.TFRecordWriter(f"{directory}/{name}-{index}.tfrecord") as out:
      for _ in range(per_file):
        x = rng.normal(size=4).astype(np.float32)
        y = float(x @ np.array([1.0, -2.0, 0.5, 3.0]) + shift)
        out.write(tf.train.Example(features=tf.train.Features(feature={
            "x": tf.train.Feature(float_list=tf.train.FloatList(value=x)),
            "y": tf.train.Feature(float_list=tf.train.FloatList(value=[y])),
        })).SerializeToString())


def parse(record):
  example = tf.io.parse_single_example(record, FEATURES)
  return example["x"], example["y"]


@gin.configurable
class StreamedMixture(trainer.Task):
  """Regression on a mixture of two sets of record files, streamed."""

  def __init__(self, data_dir=gin.REQUIRED):
    self.data_dir = data_dir

  def source(self, name, seed, training, input_context):
    return streaming.stream_files(
        tf.io.gfile.glob(f"{self.data_dir}/{name}-*.tfrecord"),
        tf.data.TFRecordDataset, training=training, seed=seed, window=100,
        input_context=input_context, parse=parse)

  def build_inputs(self, training, input_context=None):
    if not training:
      return self.source("clean", 0, False, input_context)
    return {"clean": self.source("clean", 0, True, input_context),
            "shifted": self.source("shifted", 1, True, input_context)}

  def build_model(self):
    return tf_keras.Sequential([tf_keras.Input((4,)),
                                tf_keras.layers.Dense(8, activation="tanh"),
                                tf_keras.layers.Dense(1)])

  def build_losses(self, labels, model_outputs, aux_losses=None):
    return tf.reduce_mean(tf.square(labels - model_outputs), axis=-1)

  def create_optimizer(self, settings):
    del settings
    return tf_keras.optimizers.SGD(0.05)
'''

_STREAMED_GIN = '''
import streamed_task
experiment.task = @StreamedMixture()
trainer.mixture = {"clean": 0.7, "shifted": 0.3}
trainer.global_batch_size = 32
trainer.steps_per_loop = 10
trainer.summary_interval = 10
trainer.checkpoint_interval = 20
runtime.deterministic = True
'''


# Three train.py processes, ~60 s: one kill moment (test_mixture.py kills
# in-memory mixtures at two).
@pytest.mark.slow
def test_a_mixture_of_file_sources_killed_and_resumed_is_bit_identical(
    tmp_path):
  import helpers  # pylint: disable=g-import-not-at-top
  (tmp_path / "streamed_task.py").write_text(_STREAMED_TASK_MODULE)
  (tmp_path / "streamed.gin").write_text(_STREAMED_GIN)
  data_dir = tmp_path / "data"
  data_dir.mkdir()
  subprocess.run(
      [sys.executable, "-c",
       "import streamed_task as t, sys; d = sys.argv[1]; "
       "t.write(d, 'clean', 3, 150, 0.0, 0); "
       "t.write(d, 'shifted', 2, 60, 1.0, 1)", str(data_dir)],
      cwd=str(tmp_path), check=True, timeout=120,
      env=dict(os.environ, TF_USE_LEGACY_KERAS="1"))

  def start(model_dir, steps):
    return helpers.TrainProcess(
        ["--gin_file=streamed.gin", "--mode=train", f"--model_dir={model_dir}",
         f"--gin_param=StreamedMixture.data_dir='{data_dir}'",
         f"--gin_param=trainer.train_steps={steps}"], cwd=str(tmp_path))

  killed, straight = tmp_path / "killed", tmp_path / "straight"
  saved = helpers.kill_after_first_save(start(killed, 100000), str(killed),
                                        seed=1, spread=1.0)
  state = input_state.checkpoint_bytes(tf.train.latest_checkpoint(
      str(killed)))
  assert state is not None and state < 64 * 1024, state
  final = saved + 40
  resumed = start(killed, final)
  assert resumed.finish() == 0, resumed.stderr[-2000:]
  assert f"restored checkpoint {killed}/ckpt-{saved}" in resumed.output
  reference_run = start(straight, final)
  assert reference_run.finish() == 0, reference_run.stderr[-2000:]
  helpers.assert_same_numbers(str(killed), str(straight))


def test_resumable_refuses_an_op_tensorflow_cannot_save_symbolically():
  with pytest.raises(errors.ConfigError) as raised:
    streaming.resumable(tf.data.Dataset.range(8).cache().repeat())
  assert str(raised.value) == (
      "streaming.resumable: the pipeline holds cache() (CacheDatasetV2), "
      f"which TensorFlow {tf.__version__} cannot checkpoint symbolically; "
      "take it out, or leave out `resumable` (the iterator's buffers are "
      "then saved).")
  # Python state: no iterator is saved at all, nothing to refuse.
  generated = tf.data.Dataset.from_generator(
      lambda: iter([1, 2]), output_signature=tf.TensorSpec([], tf.int32))
  assert streaming.resumable(generated).options(
      ).experimental_symbolic_checkpoint is True
