"""MnistClassification on tfds mock data (no download), through train.py's
configuration path."""

import os

import tensorflow as tf
import tensorflow_datasets as tfds

from tasks import fake_data
from tasks import mnist
from trainer import experiment
from trainer import gin_config

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
  task, runtime, config = gin_config.load_config(
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


def test_input_pipelines_read_disjoint_parts_of_a_one_file_split(tmp_path):
  # tfds refuses to shard MNIST's single train file over two pipelines;
  # the task falls back to example-level subsplits.
  fake_data.write("mnist", str(tmp_path), {"train": 40, "test": 8})
  task = mnist.MnistClassification(data_dir=str(tmp_path))

  def first_epoch(context, count):
    # The training indices go on forever, one shuffled epoch after another.
    indices = list(task.build_inputs(True, context).take(count)
                   .as_numpy_iterator())
    return [image.tobytes() for image in task.gather(indices, True)[0].numpy()]

  shards = [first_epoch(tf.distribute.InputContext(
      num_input_pipelines=2, input_pipeline_id=index), 20)
            for index in range(2)]
  everything = first_epoch(None, 40)
  assert [len(set(shard)) for shard in shards] == [20, 20]
  assert len(set(everything)) == 40
  assert not set(shards[0]) & set(shards[1])
  assert sorted(shards[0] + shards[1]) == sorted(everything)


def test_mnist_trains_from_tfrecord_files_on_two_replicas(tmp_path):
  data_dir = str(tmp_path / "data")
  fake_data.write("mnist", data_dir, {"train": 64, "test": 32})
  task, runtime, config = gin_config.load_config(
      ["gin/mnist.gin", "gin/runtime/cpu_mirrored.gin"],
      [f"MnistClassification.data_dir='{data_dir}'",
       "trainer.train_steps=8", "trainer.steps_per_loop=4",
       "trainer.summary_interval=4", "trainer.global_batch_size=16",
       "trainer.eval_batch_size=16"])
  output = experiment.run(task, "train_and_eval", str(tmp_path / "run"),
                          runtime, config)
  assert helpers.checkpoint_step(str(tmp_path / "run")) == 8
  assert 0.0 <= output["accuracy"] <= 1.0
