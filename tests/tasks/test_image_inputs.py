"""Stateless augmentation with per-example seeds: deterministic, new every
epoch, and resumed exactly from an iterator checkpoint."""

import numpy as np
import tensorflow as tf

from tasks import image_inputs


def _seeded_values(dataset, count):
  iterator = iter(dataset)
  return [next(iterator)[1].numpy().item() for _ in range(count)]


def _draws(seed=7):
  """Four examples repeated forever, each with a random draw."""
  examples = tf.data.Dataset.range(4).shuffle(
      4, seed=1, reshuffle_each_iteration=True)
  return image_inputs.augment_forever(
      examples.map(lambda x: (x,)), seed,
      lambda x, seed: (x, tf.random.stateless_uniform(
          [], seed, maxval=10**6, dtype=tf.int64)))


def test_each_example_and_epoch_gets_its_own_draw():
  values = _seeded_values(_draws(), 12)
  assert len(set(values)) == 12  # No repeats across three epochs.
  assert values == _seeded_values(_draws(), 12)  # The same on every run.
  assert values != _seeded_values(_draws(seed=8), 12)


def test_a_restored_iterator_draws_what_an_uninterrupted_one_does(tmp_path):
  straight = _seeded_values(_draws(), 10)
  iterator = iter(_draws().batch(1))
  first = [next(iterator)[1].numpy().item() for _ in range(5)]
  path = tf.train.Checkpoint(iterator=iterator).write(str(tmp_path / "i"))
  restored = iter(_draws().batch(1))
  tf.train.Checkpoint(iterator=restored).read(path)
  rest = [next(restored)[1].numpy().item() for _ in range(5)]
  assert first + rest == straight


def test_crops_and_flips_are_drawn_per_image_and_applied_at_once():
  crops = image_inputs.draw_crops_and_flips(64, tf.constant([3, 4]), 4)
  assert crops.shape == (64, 3)
  assert crops.numpy()[:, :2].min() >= 0 and crops.numpy()[:, :2].max() <= 8
  assert set(crops.numpy()[:, 2]) == {0, 1}
  np.testing.assert_array_equal(
      crops, image_inputs.draw_crops_and_flips(64, tf.constant([3, 4]), 4))
  images = np.random.RandomState(0).randint(1, 256, (64, 6, 5, 3))
  result = image_inputs.crop_and_flip(tf.constant(images, tf.uint8), crops,
                                      4).numpy()
  # By hand, one image at a time.
  for image, crop, got in zip(images, crops.numpy(), result):
    padded = np.pad(image, [(4, 4), (4, 4), (0, 0)])
    expected = padded[crop[0]:crop[0] + 6, crop[1]:crop[1] + 5]
    if crop[2]:
      expected = expected[:, ::-1]
    np.testing.assert_array_equal(got, expected)


def _jpeg(height, width):
  pixels = np.random.RandomState(0).randint(0, 256, (height, width, 3))
  return tf.io.encode_jpeg(pixels.astype(np.uint8))


def test_jpeg_crops_are_resized_squares():
  encoded = _jpeg(60, 90)
  crop = image_inputs.decode_random_crop(encoded, tf.constant([1, 2]), 32)
  assert crop.shape == (32, 32, 3) and crop.dtype == tf.float32
  np.testing.assert_array_equal(
      crop, image_inputs.decode_random_crop(encoded, tf.constant([1, 2]), 32))
  center = image_inputs.decode_center_crop(encoded, 32)
  assert center.shape == (32, 32, 3)


def test_normalize_uses_imagenet_statistics():
  mean = tf.constant([[[0.485 * 255, 0.456 * 255, 0.406 * 255]]])
  np.testing.assert_allclose(image_inputs.normalize(mean).numpy(), 0,
                             atol=1e-5)
