"""Tests of trainer.data.input_state: the bytes measured in a real
checkpoint, the buffers named from the pipeline's own graph."""

import trainer  # Keras 2 before TensorFlow.
import tensorflow as tf
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
