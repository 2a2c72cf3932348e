"""Tests of trainer.data.input_state: the bytes measured in a real
checkpoint, the buffers named from the pipeline's own graph."""

import trainer  # Keras 2 before TensorFlow.
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.data.experimental.ops import global_shuffle_op
import tf_keras

from trainer import console
from trainer import experiment
from trainer.data import input_state


def _images(count=600):
  return tf.data.Dataset.from_tensor_slices(
      (tf.random.stateless_uniform([count, 32, 32, 3], [1, 2]),
       tf.zeros([count], tf.int64)))


def _saved(tmp_path, dataset, steps=3):
  iterator = iter(dataset)
  for _ in range(steps):
    next(iterator)
  weights = tf.Variable(tf.zeros([100]))
  prefix = tf.train.Checkpoint(it=iterator, weights=weights).write(
      str(tmp_path / "ckpt"))
  return prefix, weights


def test_the_bytes_are_the_iterator_state_not_the_weights(tmp_path):
  small, _ = _saved(tmp_path / "small", tf.data.Dataset.range(10**6).batch(8))
  # A full 500-element buffer of 12 KB images is 6 MB. Measured: 12.6 MB
  # for these (image, label) pairs; 6.5 MB for the images alone.
  large, _ = _saved(tmp_path / "large",
                    _images().shuffle(500, seed=1).repeat().batch(8),
                    steps=70)
  small_bytes = input_state.checkpoint_bytes(small)
  large_bytes = input_state.checkpoint_bytes(large)
  assert 0 < small_bytes < 64 << 10  # The bound per worker.
  assert 500 * 12288 < large_bytes < 1200 * 12288
  no_iterator = tf.train.Checkpoint(v=tf.Variable(1.0)).write(
      str(tmp_path / "none" / "ckpt"))
  assert input_state.checkpoint_bytes(no_iterator) is None


def test_buffers_are_named_with_their_count_and_element():
  dataset = (_images().cache().shuffle(5000).repeat().batch(8)
             .prefetch(2))
  found = input_state.buffers(dataset)
  assert [b.kind for b in found] == ["a cache()", "a shuffle buffer",
                                     "a prefetch"]
  shuffle = found[1]
  assert (shuffle.count, shuffle.element, shuffle.element_bytes) == (
      5000, "float32[32,32,3], int64[]", 12296)
  assert shuffle.describe() == (
      "a shuffle buffer of 5000 elements (float32[32,32,3], int64[]; "
      "12 KB each, 59 MB full)")
  assert found[2].element == "float32[8,32,32,3], int64[8]"
  # A cache in files holds nothing in the checkpoint; strings have no size.
  on_disk = tf.data.Dataset.from_tensor_slices(["a", "b"]).cache("/tmp/x")
  assert input_state.buffers(on_disk) == []
  strings = input_state.buffers(
      tf.data.Dataset.from_tensor_slices(["a", "b"]).shuffle(2))
  assert strings[0].describe() == "a shuffle buffer of 2 elements (string[])"


def test_a_large_state_warns_naming_the_buffer(tmp_path, monkeypatch):
  lines = []
  monkeypatch.setattr(console, "info", lambda text: lines.append(text))
  monkeypatch.setattr(console, "warning",
                      lambda text: lines.append("warning: " + text))
  dataset = _images().shuffle(500, seed=1).repeat().batch(8)
  prefix, weights = _saved(tmp_path, dataset, steps=70)
  state = input_state.report(prefix, dataset,
                             input_state.model_bytes([weights]))
  assert state > 5 << 20
  assert lines[0] == (f"input state | {input_state.format_bytes(state)} in "
                      f"{prefix} (the training iterator's position and "
                      "buffers)")
  assert lines[1].startswith(
      f"warning: the training input's state is "
      f"{input_state.format_bytes(state)} in every checkpoint, against "
      "400 B of weights; it holds a shuffle buffer of 500 elements "
      "(float32[32,32,3], int64[]; 12 KB each, 5.9 MB full): every save "
      "writes it again.")
  assert input_state.REMEDY_PAGE in lines[1]
  lines.clear()
  small = tf.data.Dataset.range(10**6).batch(8)
  prefix, weights = _saved(tmp_path / "small", small)
  input_state.report(prefix, small, input_state.model_bytes([weights]))
  assert len(lines) == 1 and lines[0].startswith("input state | ")


def test_format_bytes():
  assert [input_state.format_bytes(n) for n in
          (812, 13 * 1024, int(4.1 * 2**20), 64 * 2**20, 3 * 2**30)] == [
              "812 B", "13 KB", "4.1 MB", "64 MB", "3.0 GB"]


class _ShuffledImages(trainer.Task):
  """A Task written as TensorFlow's guides teach: `shuffle(5000)` of
  images, a model of a few hundred weights."""

  def build_model(self):
    return tf_keras.Sequential([tf_keras.Input((16, 16, 3)),
                                tf_keras.layers.GlobalAveragePooling2D(),
                                tf_keras.layers.Dense(10)])

  def build_inputs(self, training, input_context=None):
    count = 6000 if training else 64
    images = tf.random.stateless_uniform([count, 16, 16, 3], [0, 1])
    labels = tf.zeros([count], tf.int32)
    examples = tf.data.Dataset.from_tensor_slices((images, labels))
    return examples.shuffle(5000, seed=1) if training else examples

  def build_losses(self, labels, model_outputs, aux_losses=None):
    return tf_keras.losses.sparse_categorical_crossentropy(
        labels, model_outputs, from_logits=True)


def test_a_run_says_after_its_first_save_what_the_buffer_costs(
    tmp_path, capsys):
  experiment.run(
      _ShuffledImages(), "train", str(tmp_path / "run"),
      trainer.RuntimeConfig(distribution_strategy="one_device"),
      trainer.TrainerConfig(train_steps=20, steps_per_loop=10,
                            global_batch_size=32, checkpoint_interval=10))
  lines = capsys.readouterr().out.splitlines()
  saved = lines.index(f"saved checkpoint {tmp_path / 'run' / 'ckpt-10'}")
  state = input_state.checkpoint_bytes(str(tmp_path / "run" / "ckpt-10"))
  assert state > 5000 * 3072  # The buffer is full: 5000 images of 3 KB.
  size = input_state.format_bytes(state)
  assert lines[saved + 1] == (
      f"input state | {size} in {tmp_path / 'run' / 'ckpt-10'} (the "
      "training iterator's position and buffers)")
  assert lines[saved + 2].startswith(
      f"warning | the training input's state is {size} in every "
      "checkpoint, against 160 B of weights; it holds a shuffle buffer of "
      "5000 elements (float32[16,16,3], int32[]; 3.0 KB each, 15 MB full)"
      # The framework's own prefetch of the worker's batches, after it.
      ", a prefetch of automatic size (float32[32,16,16,3], int32[32]; "
      "96 KB each)")
  # Said once, after the first save only.
  assert sum(line.startswith("input state | ") for line in lines) == 1


def _pipelines(record_file, text_file):
  """A pipeline for each op in `SYMBOLIC_OPS`, by the method that makes it."""
  numbers = tf.data.Dataset.range(40)
  negated = numbers.map(lambda x: -x)
  return {
      "from_tensor_slices": tf.data.Dataset.from_tensor_slices(tf.range(40)),
      "from_tensors": tf.data.Dataset.from_tensors(tf.range(4)).repeat(12),
      "repeat, batch": numbers.repeat().batch(3, drop_remainder=True),
      "parallel map": numbers.map(lambda x: x * 2, num_parallel_calls=4,
                                  deterministic=True),
      "prefetch": numbers.prefetch(5),
      "shuffle": numbers.shuffle(10, seed=1).repeat(),
      "filter": numbers.filter(lambda x: x % 3 > 0),
      "skip, take": numbers.skip(3).take(30),
      "shard": numbers.shard(2, 1),
      "zip": tf.data.Dataset.zip((numbers, negated)),
      "concatenate": numbers.concatenate(numbers),
      "flat_map": numbers.flat_map(lambda x: tf.data.Dataset.range(x % 3 + 1)),
      "interleave": numbers.interleave(lambda x: tf.data.Dataset.range(3),
                                       cycle_length=2),
      "TFRecordDataset": tf.data.TFRecordDataset([record_file] * 3),
      "TextLineDataset": tf.data.TextLineDataset([text_file]),
      "padded_batch": numbers.map(lambda x: tf.range(x % 4)).padded_batch(3),
      "unbatch": numbers.batch(4).unbatch(),
      "scan": numbers.scan(tf.constant(0, tf.int64),
                           lambda total, x: (total + x, total)),
      "random": tf.data.Dataset.random(seed=3).take(40),
      "sample_from_datasets": tf.data.Dataset.sample_from_datasets(
          [numbers, negated], seed=2),
      "parallel batch": numbers.batch(3, num_parallel_calls=2,
                                      deterministic=True),
      "assert_cardinality": numbers.apply(
          tf.data.experimental.assert_cardinality(40)),
      "take_while": numbers.take_while(lambda x: x < 30),
      # TensorFlow's private random-access shuffle (2.20).
      "global shuffle": global_shuffle_op._global_shuffle(numbers, seed=3),  # pylint: disable=protected-access
      "options": numbers.with_options(tf.data.Options()),
  }


def _next(iterator, count):
  return [tf.nest.map_structure(lambda t: np.asarray(t).tolist(), next(iterator))
          for _ in range(count)]


def test_every_op_said_to_allow_symbolic_checkpoints_restores_exactly(
    tmp_path):
  record_file = str(tmp_path / "records")
  with tf.io.TFRecordWriter(record_file) as writer:
    for index in range(20):
      writer.write(f"record {index}".encode())
  text_file = tmp_path / "lines"
  text_file.write_text("".join(f"line {index}\n" for index in range(20)))
  options = tf.data.Options()
  options.experimental_symbolic_checkpoint = True
  tried = set()
  for name, pipeline in _pipelines(record_file, str(text_file)).items():
    assert input_state.symbolic_blocker(pipeline) is None, name
    graph = input_state._graph(  # pylint: disable=protected-access
        pipeline, tf.data.experimental.ExternalStatePolicy.FAIL)
    tried |= {node.op for node in list(graph.node) + [
        node for function in graph.library.function
        for node in function.node_def] if "Dataset" in node.op}
    pipeline = pipeline.with_options(options)
    iterator = iter(pipeline)
    _next(iterator, 5)
    path = tf.train.Checkpoint(it=iterator).write(str(tmp_path / name))
    expected = _next(iterator, 6)
    restored = iter(pipeline)
    tf.train.Checkpoint(it=restored).read(path).assert_consumed()
    assert _next(restored, 6) == expected, name
  # Every op listed was tried here, so a TensorFlow that changes one fails.
  assert input_state.SYMBOLIC_OPS <= tried, input_state.SYMBOLIC_OPS - tried


def test_ops_that_refuse_symbolic_checkpoints_are_named(tmp_path):
  numbers = tf.data.Dataset.range(40)
  refused = {
      "cache() (CacheDatasetV2)": numbers.cache(),
      "rebatch() (RebatchDatasetV2)": numbers.batch(4).rebatch(2),
      "window() (WindowDataset)": numbers.window(3).flat_map(lambda w: w),
      "ignore_errors() (IgnoreErrorsDataset)": numbers.ignore_errors(),
      "unique() (UniqueDataset)": numbers.unique(),
      "group_by_window() (GroupByWindowDataset)": numbers.group_by_window(
          lambda x: x % 2, lambda key, window: window.batch(2), 2),
  }
  options = tf.data.Options()
  options.experimental_symbolic_checkpoint = True
  for words, pipeline in refused.items():
    assert input_state.symbolic_blocker(pipeline.repeat().prefetch(2)) == (
        words)
    # What TensorFlow does at the first save, which the name heads off.
    iterator = iter(pipeline.with_options(options))
    next(iterator)
    with pytest.raises(tf.errors.UnimplementedError):
      tf.train.Checkpoint(it=iterator).write(str(tmp_path / "refused"))
  # Not tried to its end (a restore hangs in most tries): named, kept off.
  parallel = numbers.interleave(lambda x: tf.data.Dataset.range(3),
                                cycle_length=2, num_parallel_calls=2)
  assert input_state.symbolic_blocker(parallel) == (
      "interleave(num_parallel_calls=...) (ParallelInterleaveDatasetV4)")


def test_the_warning_names_what_keeps_symbolic_checkpoints_off(
    tmp_path, monkeypatch):
  lines = []
  monkeypatch.setattr(console, "info", lambda text: None)
  monkeypatch.setattr(console, "warning", lines.append)
  dataset = _images().cache().shuffle(500, seed=1).repeat().batch(8)
  prefix, weights = _saved(tmp_path, dataset, steps=70)
  input_state.report(prefix, dataset, input_state.model_bytes([weights]))
  assert ("(`trainer.data.streaming`: positions only; this pipeline's "
          "cache() (CacheDatasetV2) prevents it)") in lines[0]
  lines.clear()
  plain = _images().shuffle(500, seed=1).repeat().batch(8)
  prefix, weights = _saved(tmp_path / "plain", plain, steps=70)
  input_state.report(prefix, plain, input_state.model_bytes([weights]))
  assert "(`trainer.data.streaming`: positions only), a smaller" in lines[0]
