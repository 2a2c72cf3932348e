"""ImdbSentiment: hashed tensorflow-text tokens, a Model Garden Transformer
encoder, training from its gin file on mock data, and a raw-text export."""

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from tasks import imdb
from trainer import experiment
from trainer import gin_config

import helpers


def test_tokens_are_case_folded_split_hashed_and_padded():
  task = imdb.ImdbSentiment(max_length=6)
  ids = task.tokenize(tf.constant(
      ["Great movie!", "great MOVIE !", "a b c d e f g h", ""])).numpy()
  assert ids.shape == (4, 6) and ids.dtype == np.int32
  np.testing.assert_array_equal(ids[0], ids[1])  # Case and spacing.
  assert list(ids[0][3:]) == [0, 0, 0] and all(ids[0][:3] > 0)
  assert all(ids[2] > 0)  # Cut at max_length.
  assert not ids[3].any()
  assert ids.max() < task.vocab_size


def test_model_is_built_from_model_garden_layers():
  model = imdb.ImdbSentiment(max_length=32).build_model()
  kinds = {type(layer).__name__ for layer in model.layers}
  assert {"OnDeviceEmbedding", "PositionEmbedding",
          "TransformerEncoderBlock"} <= kinds
  assert model.output_shape == (None, 2)
  # Padding is masked out of attention and pooling: whatever the padding
  # id's embedding, the logits of a padded review stay the same.
  ids = imdb.ImdbSentiment(max_length=32).tokenize(
      tf.constant(["one two three", "one two three four"]))
  before = model(ids).numpy()
  table = model.get_layer("token_embedding").embeddings
  table.assign(tf.tensor_scatter_nd_update(
      table, [[0]], tf.fill([1, table.shape[1]], 50.0)))
  np.testing.assert_allclose(model(ids), before, rtol=1e-5, atol=1e-6)


def test_gin_file_trains_on_mock_data_and_exports_raw_text(tmp_path):
  task, runtime, config = gin_config.load_config(
      ["gin/imdb.gin"],
      ["trainer.train_steps=6", "trainer.steps_per_loop=3",
       "trainer.summary_interval=3", "trainer.checkpoint_interval=6",
       "trainer.validation_interval=6", "trainer.global_batch_size=8",
       "trainer.eval_batch_size=8", "learning_rate.warmup_steps=2",
       "ImdbSentiment.max_length=32", "export.at_end=True"])
  with tfds.testing.mock_data(num_examples=24):
    output = experiment.run(task, "train_and_eval", str(tmp_path), runtime,
                            config)
  assert helpers.checkpoint_step(str(tmp_path)) == 6
  assert 0.0 <= output["accuracy"] <= 1.0
  serve = tf.saved_model.load(str(tmp_path / "export" / "6")).signatures[
      "serving_default"]
  texts = tf.constant(["a wonderful film", "dull and far too long"])
  model = task.build_model()
  tf.train.Checkpoint(model=model).read(
      tf.train.latest_checkpoint(str(tmp_path))).expect_partial()
  np.testing.assert_allclose(serve(text=texts)["outputs"],
                             model(task.tokenize(texts)), rtol=1e-5,
                             atol=1e-6)
