"""MnistClassification on tfds mock data (no download), through train.py's
configuration path."""

import os

import tensorflow_datasets as tfds

from tasks import mnist
from trainer import cli
from trainer import experiment

import helpers


def test_model_is_the_tutorial_cnn():
  model = mnist.MnistClassification().build_model()
  kinds = [type(layer).__name__ for layer in model.layers]
  assert kinds == ["Conv2D", "MaxPooling2D", "Flatten", "Dense", "Dense"]
  assert model.layers[0].filters == 32
  assert model.layers[0].kernel_size == (3, 3)
  assert model.layers[3].units == 64 and model.layers[4].units == 10
  assert model.output_shape == (None, 10)


def test_mnist_gin_trains_and_evaluates_on_mock_data(tmp_path):
  task, runtime, config = cli.load_config(
      ["gin/mnist.gin", "gin/runtime/cpu_mirrored.gin"],
      ["trainer.train_steps=20", "trainer.steps_per_loop=10",
       "trainer.summary_interval=10", "trainer.validation_interval=10",
       "trainer.global_batch_size=16", "trainer.eval_batch_size=32",
       "trainer.validation_steps=3"])
  assert isinstance(task, mnist.MnistClassification)
  model_dir = str(tmp_path)
  with tfds.testing.mock_data(num_examples=96):
    output = experiment.run(task, "train_and_eval", model_dir, runtime,
                            config)
  assert helpers.checkpoint_step(model_dir) == 20
  assert 0.0 <= float(output["accuracy"]) <= 1.0
  assert float(output["loss"]) > 0.0
  evals = helpers.read_scalars(os.path.join(model_dir, "eval"))
  assert [step for step, _ in evals["accuracy"]] == [10, 20]
  train = helpers.read_scalars(os.path.join(model_dir, "train"))
  assert [step for step, _ in train["accuracy"]] == [10, 20]
