"""ImageNetResNet50: Model Garden's ResNet-50, the standard preprocessing on
fake JPEG files, label smoothing, and the recipe's gin files."""

import numpy as np
import pytest
import tensorflow as tf

from tasks import fake_data
from tasks import imagenet
from trainer import errors
from trainer import experiment
from trainer import gin_config
from trainer.data import input_state

import helpers

SMOKE = "gin/experiments/imagenet_resnet50_cpu_smoke.gin"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  directory = str(tmp_path_factory.mktemp("tfds"))
  fake_data.write("imagenet2012", directory, {"train": 16, "validation": 8},
                  image_sizes=(48, 80))
  return directory


def test_model_is_model_gardens_resnet50():
  model = imagenet.ImageNetResNet50(image_size=64).build_model()
  assert type(model.backbone).__name__ == "ResNet"
  assert model.count_params() == 25_610_152  # ResNet-50's 25.6 million.
  assert model(tf.zeros([2, 64, 64, 3])).shape == (2, 1000)
  # L2 weight decay on every kernel (and none on biases or batch norm).
  kernels = [v for v in model.trainable_variables if "kernel" in v.name]
  assert len(model.losses) == len(kernels) == 54


def test_training_crops_are_random_and_evaluation_crops_central(data_dir):
  task = imagenet.ImageNetResNet50(data_dir=data_dir, image_size=32,
                                  shuffle_window=16)
  train = list(task.build_inputs(True).take(20).as_numpy_iterator())
  assert all(image.shape == (32, 32, 3) for image, _ in train)
  assert all(0 <= label < 1000 for _, label in train)
  # Normalised with ImageNet's statistics: uniform noise has a mean near
  # (127.5 - mean) / std per channel.
  mean = np.mean([image for image, _ in train], axis=(0, 1, 2))
  np.testing.assert_allclose(mean, (127.5 - np.array([123.675, 116.28,
                                                      103.53])) /
                             np.array([58.395, 57.12, 57.375]), atol=0.1)
  evals = [image for image, _ in task.build_inputs(False).as_numpy_iterator()]
  again = [image for image, _ in task.build_inputs(False).as_numpy_iterator()]
  assert len(evals) == 8
  np.testing.assert_array_equal(evals, again)  # No randomness in eval.


def test_label_smoothing():
  task = imagenet.ImageNetResNet50(num_classes=4, label_smoothing=0.2)
  logits = tf.constant([[2.0, 0.0, 0.0, 0.0]])
  log_probs = tf.nn.log_softmax(logits)[0].numpy()
  targets = np.full(4, 0.2 / 4) + np.array([0.8, 0, 0, 0])
  expected = -np.sum(targets * log_probs)
  np.testing.assert_allclose(task.build_losses(tf.constant([0]), logits),
                             [expected], rtol=1e-6)


# A whole ResNet-50 recipe run (~13 s); test_cloud_storage runs it too,
# on a bucket; the model and the preprocessing are tested in-process here.
@pytest.mark.slow
def test_cpu_smoke_config_trains_on_fake_files(data_dir, tmp_path):
  # Real record files: the task streams them itself (`tfds.testing.mock_data`
  # replaces `tfds.load`, which the training input does not call).
  task, runtime, config = gin_config.load_config(
      [SMOKE], [f"ImageNetResNet50.data_dir='{data_dir}'"])
  assert config.global_batch_size == 8 and task.image_size == 64
  output = experiment.run(task, "train_and_eval", str(tmp_path), runtime,
                          config)
  assert helpers.checkpoint_step(str(tmp_path)) == 4
  assert set(output) == {"accuracy", "top_5_accuracy", "loss"}
  assert np.isfinite(output["loss"])


@pytest.mark.slow  # 26-30 s; the in-process smoke test stays in the default run.
def test_cpu_smoke_config_through_the_command_line(data_dir, tmp_path):
  result = helpers.run_cli([
      f"--gin_file={SMOKE}",
      f"--gin_param=ImageNetResNet50.data_dir='{data_dir}'",
      f"--model_dir={tmp_path}"])
  assert result.returncode == 0, result.stderr[-2000:]
  assert "final eval | accuracy" in result.stdout
  assert "learning rate | x0.03125 for global batch 8" in result.stdout


@pytest.fixture(scope="module")
def one_file_of_1024(tmp_path_factory):
  """1,024 training images in one record file, as real ImageNet's files
  hold about 1,250: a window of 10,000 then crosses 10 file ends, not 625
  (symbolic checkpointing's bookkeeping grows with them; see
  trainer/data/streaming.py)."""
  directory = str(tmp_path_factory.mktemp("tfds_1024"))
  fake_data.write("imagenet2012", directory, {"train": 1024, "validation": 8},
                  image_sizes=(48, 80))
  return directory


def _smoke_args(data_dir, model_dir, steps):
  return [f"--gin_file={SMOKE}", "--mode=train",
          f"--gin_param=ImageNetResNet50.data_dir='{data_dir}'",
          "--gin_param=ImageNetResNet50.shuffle_window=10000",
          "--gin_param=runtime.deterministic=True",
          "--gin_param=trainer.steps_per_loop=1",
          "--gin_param=trainer.checkpoint_interval=2",
          f"--gin_param=trainer.train_steps={steps}",
          f"--model_dir={model_dir}"]


@pytest.mark.slow  # Three ResNet-50 runs, ~60 s.
def test_sigkill_after_a_save_resumes_exactly_from_kilobytes(
    one_file_of_1024, tmp_path):
  """The recipe's input resumes where it was (no restart of the data): the
  resumed weights are bit-identical to an uninterrupted run's, with a
  10,000-image shuffle window and at most 64 KB of input state."""
  killed = tmp_path / "killed"
  saved = helpers.kill_after_first_save(
      helpers.TrainProcess(_smoke_args(one_file_of_1024, killed, 100000)),
      str(killed), seed=0, spread=1.0, first=2,
      timeout=300)  # ResNet-50's first steps trace for a minute on busy cores.
  prefix = tf.train.latest_checkpoint(str(killed))
  state = input_state.checkpoint_bytes(prefix)
  assert state is not None and state <= 64 * 1024, state

  final = saved + 3
  resumed = helpers.TrainProcess(_smoke_args(one_file_of_1024, killed, final))
  assert resumed.finish(timeout=300) == 0, resumed.stderr[-2000:]
  assert f"restored checkpoint {killed}/ckpt-{saved} at step {saved}" in (
      resumed.output)
  straight = helpers.TrainProcess(
      _smoke_args(one_file_of_1024, tmp_path / "straight", final))
  assert straight.finish(timeout=300) == 0, straight.stderr[-2000:]
  helpers.assert_same_numbers(str(killed), str(tmp_path / "straight"))


@pytest.mark.parametrize("path,params,expected", [
    ("gin/experiments/imagenet_resnet50_gpu.gin", [],
     dict(strategy="mirrored", dtype="float16", num_gpus=8, batch=1024,
          steps=112590, warmup=6255)),
    ("gin/experiments/imagenet_resnet50_tpu.gin",
     ['runtime.tpu="grpc://10.0.0.2:8470"'],
     dict(strategy="tpu", dtype="bfloat16", num_gpus=0, batch=4096,
          steps=28170, warmup=1565)),
])
def test_hardware_configs(path, params, expected):
  task, runtime, config = gin_config.load_config([path], params)
  assert (runtime.distribution_strategy, runtime.mixed_precision_dtype,
          runtime.num_gpus) == (expected["strategy"], expected["dtype"],
                                expected["num_gpus"])
  assert (config.global_batch_size, config.train_steps,
          config.learning_rate.warmup_steps) == (
              expected["batch"], expected["steps"], expected["warmup"])
  # 90 epochs of 1,281,167 images, warm-up 5 of them.
  epoch = config.train_steps / 90
  assert abs(epoch - 1281167 / config.global_batch_size) < 1
  assert config.learning_rate.warmup_steps == round(5 * epoch)
  assert (config.optimizer.name, config.learning_rate.schedule,
          config.learning_rate.reference_batch_size) == ("sgd", "cosine", 256)
  assert task.label_smoothing == 0.1
  # The input streams through windows no checkpoint holds: resumed exactly.
  assert config.input_position == "checkpoint" and task.shuffle_window == 10000


def test_tpu_config_needs_its_address():
  with pytest.raises(errors.ConfigError, match="tpu"):
    gin_config.load_config(["gin/experiments/imagenet_resnet50_tpu.gin"], [])
