"""Cifar10Classification: the scaling guide's CNN, augmented inputs from
tfds mock data and fake files, and an exact resume with augmentation."""

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

import trainer
from tasks import cifar10
from tasks import fake_data
from tasks import image_inputs
from trainer import experiment
from trainer import gin_config
from trainer.data import inputs as inputs_lib

import helpers


def test_model_is_the_scaling_guides_cnn():
  model = cifar10.Cifar10Classification().build_model()
  # After the scaling of uint8 pixels to [0, 1].
  assert [type(layer).__name__ for layer in model.layers] == [
      "Rescaling", "Conv2D", "MaxPooling2D", "Conv2D", "MaxPooling2D",
      "Flatten", "Dense", "Dense"]
  assert [model.layers[i].filters for i in (1, 3)] == [32, 64]
  assert [model.layers[i].units for i in (6, 7)] == [64, 10]
  assert model.input.dtype == tf.uint8 and model.output_shape == (None, 10)
  np.testing.assert_allclose(
      model.layers[0](tf.constant([[255]], tf.uint8)), [[1.0]])


def test_gin_file_trains_and_evaluates_on_mock_data(tmp_path):
  task, runtime, config = gin_config.load_config(
      ["gin/cifar10.gin", "gin/runtime/cpu_mirrored.gin"],
      ["trainer.train_steps=10", "trainer.steps_per_loop=5",
       "trainer.summary_interval=5", "trainer.validation_interval=5",
       "trainer.checkpoint_interval=5", "trainer.global_batch_size=16",
       "trainer.eval_batch_size=16"])
  assert isinstance(task, cifar10.Cifar10Classification) and task.augment
  with tfds.testing.mock_data(num_examples=48):
    output = experiment.run(task, "train_and_eval", str(tmp_path), runtime,
                            config)
  assert helpers.checkpoint_step(str(tmp_path)) == 10
  assert 0.0 <= output["accuracy"] <= 1.0
  evals = helpers.read_scalars(str(tmp_path / "eval"))
  assert [step for step, _ in evals["accuracy"]] == [5, 10]


def test_training_batches_carry_crops_evaluation_batches_not(tmp_path):
  fake_data.write("cifar10", str(tmp_path), {"train": 8, "test": 8})
  task = cifar10.Cifar10Classification(data_dir=str(tmp_path))
  config = trainer.TrainerConfig(global_batch_size=8, eval_batch_size=8)
  strategy = tf.distribute.get_strategy()
  runtime = trainer.RuntimeConfig()
  train = iter(inputs_lib.for_task(task, True, strategy, config,
                                     runtime).dataset)
  epochs = [next(train) for _ in range(3)]
  for features, labels in epochs:
    assert features["image"].dtype == tf.uint8
    assert features["image"].shape == (8, 32, 32, 3)
    assert features["crops"].shape == (8, 3) and labels.shape == (8,)
  # Every epoch draws new crops for the same images.
  assert len({features["crops"].numpy().tobytes()
              for features, _ in epochs}) == 3
  evaluation = next(iter(inputs_lib.for_task(task, False, strategy, config,
                                               runtime).dataset))
  images, _ = evaluation
  assert images.dtype == tf.uint8 and images.shape == (8, 32, 32, 3)


def test_heavy_augmentation_crops_resizes_and_jitters_in_the_pipeline(
    tmp_path):
  fake_data.write("cifar10", str(tmp_path), {"train": 8, "test": 8})
  task = cifar10.Cifar10Classification(data_dir=str(tmp_path),
                                       heavy_augmentation=True)
  config = trainer.TrainerConfig(global_batch_size=8)
  dataset = inputs_lib.for_task(task, True, tf.distribute.get_strategy(),
                                config, trainer.RuntimeConfig()).dataset
  batches = [next(iter(dataset)) for _ in range(2)]
  # Augmented images, ready for the model: no crops left to the step.
  images, labels = batches[0]
  assert images.dtype == tf.uint8 and images.shape == (8, 32, 32, 3)
  assert labels.shape == (8,)
  # Stateless: a new iterator draws the same; the next batch other ones.
  np.testing.assert_array_equal(images, batches[1][0])
  iterator = iter(dataset)
  next(iterator)
  assert not np.array_equal(images, next(iterator)[0])


def test_resized_crop_flip_and_jitter_draws_per_image():
  images = tf.constant(np.random.RandomState(0).randint(
      0, 256, (6, 32, 32, 3)), tf.uint8)
  seed = tf.constant([1, 2], tf.int64)
  out = image_inputs.resized_crop_flip_and_jitter(images, seed)
  assert out.dtype == tf.uint8 and out.shape == images.shape
  np.testing.assert_array_equal(
      out, image_inputs.resized_crop_flip_and_jitter(images, seed))
  # Each image is changed, each differently from the same source.
  same = tf.tile(images[:1], [6, 1, 1, 1])
  varied = image_inputs.resized_crop_flip_and_jitter(same, seed).numpy()
  assert len({image.tobytes() for image in varied}) == 6
  assert all(not np.array_equal(image, images[0]) for image in varied)


def test_the_step_applies_the_crops(tmp_path):
  task = cifar10.Cifar10Classification()
  model = task.build_model()
  optimizer = tf.keras.optimizers.SGD()
  images = tf.constant(np.random.RandomState(0).randint(
      0, 256, (4, 32, 32, 3)), tf.uint8)
  crops = tf.constant([[0, 0, 0], [4, 4, 1], [8, 2, 0], [4, 4, 0]])
  labels = tf.constant([1, 2, 3, 4])
  loss, _, outputs = task.compute_gradients(
      ({"image": images, "crops": crops}, labels), model, optimizer)
  cropped = image_inputs.crop_and_flip(images, crops, 4)
  np.testing.assert_allclose(outputs, model(cropped), rtol=1e-5)
  # [4, 4, 0] is the identity crop.
  np.testing.assert_allclose(outputs[3], model(images)[3], rtol=1e-5)


def test_augmented_training_resumes_exactly(tmp_path):
  fake_data.write("cifar10", str(tmp_path / "data"), {"train": 48,
                                                      "test": 16})

  def run(model_dir, train_steps):
    experiment.run(
        cifar10.Cifar10Classification(data_dir=str(tmp_path / "data")),
        "train", str(tmp_path / model_dir),
        trainer.RuntimeConfig(deterministic=True),
        trainer.TrainerConfig(train_steps=train_steps, steps_per_loop=5,
                              summary_interval=5, checkpoint_interval=5,
                              global_batch_size=16))
    return helpers.checkpoint_numbers(str(tmp_path / model_dir))

  straight = run("straight", 20)
  run("resumed", 10)  # Stops mid-epoch 4 (3 steps an epoch).
  resumed = run("resumed", 20)
  for name, value in straight.items():
    if name != "save_counter/.ATTRIBUTES/VARIABLE_VALUE":
      np.testing.assert_array_equal(resumed[name], value, err_msg=name)
  # The iterator in the checkpoint holds indices, not the images.
  reader = tf.train.load_checkpoint(str(tmp_path / "resumed"))
  assert "train_iterator/.ATTRIBUTES/ITERATOR_STATE" in (
      reader.get_variable_to_shape_map())
