"""The shipped digits job, run as a user runs it: through train.py."""

import os

import numpy as np
import pytest
from sklearn import datasets

from tasks import digits

import helpers

DIGITS = "--gin_file=gin/digits.gin"


def test_split_is_fixed_and_disjoint():
  train_images, train_labels = digits.load_split(training=True)
  eval_images, eval_labels = digits.load_split(training=False)
  assert train_images.shape == (1437, 8, 8, 1)
  assert eval_images.shape == (360, 8, 8, 1)
  assert 0.0 <= train_images.min() and train_images.max() <= 1.0
  assert set(train_labels) == set(eval_labels) == set(range(10))
  train_rows = {image.tobytes() for image in train_images}
  assert sum(image.tobytes() in train_rows for image in eval_images) < 5
  again, _ = digits.load_split(training=False)
  assert (again == eval_images).all()


def test_the_digits_are_scikit_learns_read_without_importing_it(monkeypatch):
  expected = datasets.load_digits()
  digits.load_digits.cache_clear()
  # The fallback, scikit-learn's own loader, would fail here (this module
  # has imported sklearn, so `from sklearn import datasets` still works).
  monkeypatch.setattr(datasets, "load_digits", lambda: pytest.fail(
      "tasks.digits imported scikit-learn's loader"))
  images, labels = digits.load_digits()
  monkeypatch.undo()
  assert images.shape == (1797, 8, 8) and labels.shape == (1797,)
  np.testing.assert_array_equal(images, expected.images)
  np.testing.assert_array_equal(labels, expected.target)
  assert not images.flags.writeable and digits.load_digits()[0] is images


def test_digits_reaches_the_accuracy_bar(tmp_path):
  model_dir = tmp_path / "digits"
  result = helpers.run_cli([DIGITS, f"--model_dir={model_dir}"])
  assert result.returncode == 0, result.stderr[-2000:]
  evals = helpers.read_scalars(os.path.join(model_dir, "eval"))
  step, accuracy = evals["accuracy"][-1]
  assert step == 1000
  assert accuracy >= 0.95
  assert f"final eval | accuracy {accuracy:.4f}" in result.stdout
  assert (model_dir / "operative_config.gin").exists()
  progress = [line for line in result.stdout.splitlines()
              if line.startswith("train | step ") and "/1000" in line]
  assert len(progress) == 10  # One line per loop of 100 steps.
  assert all("steps/s" in line and "examples/s" in line and "loss" in line
             and "ETA" in line for line in progress)


@pytest.mark.parametrize("runtime", [
    ['--gin_param=runtime.distribution_strategy="mirrored"',
     "--gin_param=runtime.num_cpu_devices=2"],
    # The shipped runtime file: the same strategy, bound by a file.
    pytest.param(["--gin_file=gin/runtime/cpu_mirrored.gin"],
                 marks=pytest.mark.slow),
])
def test_digits_is_replica_invariant(tmp_path, runtime):
  # Over the first 10 steps only. This CNN's ReLUs make training
  # discontinuous: once a pre-activation within rounding of zero flips sign
  # on one run and not the other, the weights jump apart (measured here,
  # one_device vs mirrored with SGD: 1.5e-8 after 15 steps, 1.2e-4 after
  # 20; a 1e-6 relative change of the learning rate on one device gives
  # 5e-3 to 5e-2 after 300 steps, with Adam or SGD). Invariance over long
  # runs is shown on a smooth problem in tests/model/test_task.py.
  common = [DIGITS, "--gin_param=trainer.train_steps=10",
            "--gin_param=trainer.steps_per_loop=5",
            "--gin_param=trainer.summary_interval=5",
            '--gin_param=optimizer.name="sgd"',
            "--gin_param=optimizer.learning_rate=0.05",
            "--gin_param=runtime.seed=0", "--mode=train"]
  one = helpers.run_cli(common + [
      '--gin_param=runtime.distribution_strategy="one_device"',
      f"--model_dir={tmp_path / 'one'}"])
  two = helpers.run_cli(common + runtime + [f"--model_dir={tmp_path / 'two'}"])
  assert one.returncode == 0, one.stderr[-2000:]
  assert two.returncode == 0, two.stderr[-2000:]
  one_weights = helpers.checkpoint_weights(str(tmp_path / "one"))
  two_weights = helpers.checkpoint_weights(str(tmp_path / "two"))
  assert helpers.max_weight_difference(one_weights, two_weights) < 1e-6
  one_loss = helpers.read_scalars(str(tmp_path / "one" / "train"))["loss"]
  two_loss = helpers.read_scalars(str(tmp_path / "two" / "train"))["loss"]
  assert len(one_loss) == 2
  assert [v for _, v in one_loss] == pytest.approx([v for _, v in two_loss],
                                                   rel=1e-5)


def test_input_pipelines_read_disjoint_shards():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  task = digits.DigitsClassification()
  shards = []
  for index in range(2):
    context = tf.distribute.InputContext(num_input_pipelines=2,
                                         input_pipeline_id=index)
    shards.append({image.tobytes() for image, _ in
                   task.build_inputs(True, context).as_numpy_iterator()})
  assert len(shards[0]) + len(shards[1]) >= 1437 - 10  # A few duplicates.
  assert len(shards[0] & shards[1]) < 5
