"""Image pipeline pieces the shipped tasks share.

Augmentation uses stateless random ops with one seed per example and epoch,
derived from a counter that is part of the iterator's checkpoint, so a
resumed run draws the same crops and flips as an uninterrupted one. (Model
Garden's `preprocess_ops.random_crop_image_v2` samples with the stateful
`sample_distorted_bounding_box`, whose state no checkpoint holds; the
stateless counterpart below mirrors it. `tf.data.Dataset.random` with
`rerandomize_each_iteration` was measured not to restore its epoch counter.)
"""

from typing import Callable

import tensorflow as tf
from official.vision.ops import preprocess_ops

AUTOTUNE = tf.data.AUTOTUNE


def augment_forever(dataset: tf.data.Dataset, seed: int,
                    augment: Callable[..., tuple]) -> tf.data.Dataset:
  """Repeats `dataset` and maps `augment(*example, seed=s)` over it in
  parallel, `s` a distinct stateless seed (shape [2]) per example and epoch.

  Shuffle `dataset` (with `reshuffle_each_iteration`) before calling this:
  the repetition happens here, so the framework's own `repeat` is a no-op.
  """
  base = tf.constant(seed, tf.int64)

  def seeded(index, example):
    return augment(*example, seed=tf.stack([base, index]))

  return dataset.repeat().enumerate().map(seeded, num_parallel_calls=AUTOTUNE)


def draw_crops_and_flips(count: tf.Tensor, seed: tf.Tensor,
                         padding: int) -> tf.Tensor:
  """Draws each image's crop offsets and flip: `[count, 3]` int32 (row and
  column offset into the padded image, 1 to flip).

  Drawn in the input pipeline (a few numbers per image) and applied in the
  training step by `crop_and_flip`: the pixel work then runs on the device,
  in the step's own threads, rather than on the CPU beside it.
  """
  offset_seed, flip_seed = tf.unstack(
      tf.random.experimental.stateless_split(seed, 2))
  offsets = tf.random.stateless_uniform([count, 2], offset_seed, 0,
                                        2 * padding + 1, tf.int32)
  flips = tf.cast(tf.random.stateless_uniform([count, 1], flip_seed) < 0.5,
                  tf.int32)
  return tf.concat([offsets, flips], axis=1)


def crop_and_flip(images: tf.Tensor, crops: tf.Tensor,
                  padding: int) -> tf.Tensor:
  """Pads a batch `[n, h, w, c]` by `padding`, crops each image back to
  `h x w` at its offsets and flips it if asked (`draw_crops_and_flips`)."""
  shape = tf.shape(images)
  height, width = shape[1], shape[2]
  padded = tf.pad(images, [[0, 0], [padding, padding], [padding, padding],
                           [0, 0]])
  rows = crops[:, :1] + tf.range(height)[None]  # [n, h]
  columns = tf.range(width)[None]
  columns = tf.where(crops[:, 2:] > 0, width - 1 - columns, columns)
  columns += crops[:, 1:2]  # [n, w], reversed for flipped images.
  cropped = tf.gather(padded, rows, axis=1, batch_dims=1)
  return tf.gather(cropped, columns, axis=2, batch_dims=1)


def resized_crop_flip_and_jitter(images: tf.Tensor,
                                 seed: tf.Tensor) -> tf.Tensor:
  """SimCLR's image augmentation, on a whole batch `[n, h, w, 3]` of uint8.

  Per image: a random crop of 8% to 100% of the area with an aspect ratio
  in [3/4, 4/3], resized back to `h x w` (bilinear) and flipped left-right
  half the time; then colour jitter (brightness, contrast and saturation
  each scaled by up to +-40%), and grayscale for one image in five. Every
  draw is stateless from `seed`, and the work is batched ops: a few per
  batch, not per image.
  """
  count, height, width = (tf.shape(images)[0], tf.shape(images)[1],
                          tf.shape(images)[2])
  seeds = tf.unstack(tf.random.experimental.stateless_split(seed, 7))

  def uniform(index, low, high):
    return tf.random.stateless_uniform([count], seeds[index], low, high)

  area = uniform(0, 0.08, 1.0)
  ratio = tf.exp(uniform(1, tf.math.log(3 / 4), tf.math.log(4 / 3)))
  crop_height = tf.minimum(tf.sqrt(area / ratio), 1.0)
  crop_width = tf.minimum(tf.sqrt(area * ratio), 1.0)
  top = uniform(2, 0.0, 1.0) * (1.0 - crop_height)
  left = uniform(3, 0.0, 1.0) * (1.0 - crop_width)
  left, right = left, left + crop_width
  flip = uniform(4, 0.0, 1.0) < 0.5
  # `crop_and_resize` flips a box whose x1 > x2.
  left, right = tf.where(flip, right, left), tf.where(flip, left, right)
  boxes = tf.stack([top, left, top + crop_height, right], axis=1)
  pixels = tf.image.crop_and_resize(
      tf.cast(images, tf.float32), boxes, tf.range(count), [height, width])
  jitter = tf.reshape(uniform(5, 0.6, 1.4), [-1, 1, 1, 1])
  strength = tf.random.stateless_uniform([3, count, 1, 1, 1], seeds[6], 0.6,
                                         1.4)
  pixels *= jitter  # Brightness.
  mean = tf.reduce_mean(pixels, axis=[1, 2, 3], keepdims=True)
  pixels = (pixels - mean) * strength[0] + mean  # Contrast.
  gray = tf.image.rgb_to_grayscale(pixels)
  saturation = tf.where(strength[2] < 0.68, 0.0, strength[1])  # 1 in 5.
  pixels = gray + (pixels - gray) * saturation
  return tf.cast(tf.clip_by_value(pixels, 0.0, 255.0), tf.uint8)


def decode_random_crop(encoded: tf.Tensor, seed: tf.Tensor,
                       image_size: int) -> tf.Tensor:
  """Inception-style crop of a JPEG, resized to a square, flipped at random.

  A box of 8% to 100% of the area with an aspect ratio in [3/4, 4/3] is
  sampled (as Model Garden's `random_crop_image_v2`), and only that box is
  decoded.
  """
  box_seed, flip_seed = tf.unstack(
      tf.random.experimental.stateless_split(seed, 2))
  shape = tf.image.extract_jpeg_shape(encoded)
  offset, size, _ = tf.image.stateless_sample_distorted_bounding_box(
      shape, tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]),
      seed=box_seed, min_object_covered=0.1,
      aspect_ratio_range=(3.0 / 4.0, 4.0 / 3.0), area_range=(0.08, 1.0),
      max_attempts=10)
  window = tf.stack([offset[0], offset[1], size[0], size[1]])
  image = tf.image.decode_and_crop_jpeg(encoded, window, channels=3)
  image = tf.image.resize(image, [image_size, image_size])
  return tf.image.stateless_random_flip_left_right(image, flip_seed)


def decode_center_crop(encoded: tf.Tensor, image_size: int) -> tf.Tensor:
  """The central 87.5% square of a JPEG, resized (Model Garden's eval crop)."""
  image = preprocess_ops.center_crop_image_v2(
      encoded, tf.image.extract_jpeg_shape(encoded))
  return tf.image.resize(image, [image_size, image_size])


def normalize(image: tf.Tensor) -> tf.Tensor:
  """Scales RGB values in [0, 255] to zero mean and unit variance per
  channel, with ImageNet's statistics (Model Garden's)."""
  return preprocess_ops.normalize_scaled_float_image(
      tf.cast(image, tf.float32), preprocess_ops.MEAN_RGB,
      preprocess_ops.STDDEV_RGB)
