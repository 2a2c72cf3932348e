"""The eval images action: the last evaluation's images, read back."""

import numpy as np
import tensorflow as tf

from trainer import actions

import helpers


class _Step:
  """The global step an action reads; the test moves it."""

  def __init__(self, step=0):
    self.step = step

  def __call__(self):
    return self.step


def test_eval_images_writer_writes_the_last_evaluations_images(tmp_path):
  images, step = {}, _Step(30)
  writer = actions.EvalImagesWriter(str(tmp_path / "eval"), lambda: images,
                                    step_fn=step)
  writer({"loss": 1.0})  # No images: nothing written.
  assert not (tmp_path / "eval").exists()
  images["samples/digit"] = np.full((4, 3, 1), 0.5, np.float32)
  writer({"loss": 1.0})
  png = tmp_path / "eval" / "images" / "samples_digit-30.png"
  decoded = tf.io.decode_png(png.read_bytes()).numpy()
  assert decoded.shape == (4, 3, 1) and (decoded == 128).all()
  assert helpers.read_tags(str(tmp_path / "eval")) == {"samples/digit"}
