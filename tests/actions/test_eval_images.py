"""The eval images action: the last evaluation's images, read back."""

import numpy as np
import tensorflow as tf

from trainer import actions

import helpers
import ram_urls


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


def test_the_images_of_a_url_model_dir_are_written_there(tmp_path,
                                                        monkeypatch):
  model_dir = ram_urls.model_dir(tmp_path, monkeypatch)
  images = {"samples/digit": np.full((4, 3, 1), 0.5, np.float32)}
  actions.EvalImagesWriter(f"{model_dir}/eval", lambda: images,
                           step_fn=_Step(30), model_dir=model_dir)({})
  with tf.io.gfile.GFile(
      f"{model_dir}/eval/images/samples_digit-30.png", "rb") as f:
    assert (tf.io.decode_png(f.read()).numpy() == 128).all()
  assert [name for name in ram_urls.names(model_dir)
          if name.startswith("eval/events.")]
  assert ram_urls.nothing_local(tmp_path)
