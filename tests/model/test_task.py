"""The default Task steps scale losses by the GLOBAL batch.

Same global batch on 1 and 2 replicas must give the same weights and the same
reported loss; averaging over the per-replica batch instead must not.
"""

import os
import textwrap

import pytest
import tensorflow as tf

import trainer
from trainer import experiment
from trainer.model import task as task_lib

import helpers

TIGHT = 1e-5


def _train(task, strategy, model_dir, steps=40, **overrides):
  runtime = trainer.RuntimeConfig(
      distribution_strategy=strategy,
      num_cpu_devices=2 if strategy == "mirrored" else 0, seed=1)
  config = trainer.TrainerConfig(
      train_steps=steps, steps_per_loop=10, summary_interval=10,
      global_batch_size=32, checkpoint_interval=steps, **overrides)
  experiment.run(task, "train", model_dir, runtime, config)
  losses = helpers.read_scalars(os.path.join(model_dir, "train"))["loss"]
  return helpers.checkpoint_weights(model_dir), [v for _, v in losses]


def test_one_device_and_mirrored_give_same_weights_and_loss(tmp_path):
  one_w, one_loss = _train(helpers.LinearRegression(), "one_device",
                           str(tmp_path / "one"))
  two_w, two_loss = _train(helpers.LinearRegression(), "mirrored",
                           str(tmp_path / "two"))
  assert helpers.max_weight_difference(one_w, two_w) < TIGHT
  assert one_loss == pytest.approx(two_loss, rel=1e-5)
  assert one_loss[-1] < one_loss[0] / 5  # It learned something.


def test_per_replica_loss_scaling_breaks_the_same_check(tmp_path):
  one_w, one_loss = _train(helpers.PerReplicaMeanLinearRegression(),
                           "one_device", str(tmp_path / "one"))
  # Without `trainer.loss_scaling`'s check, which stops it at step 1.
  two_w, two_loss = _train(helpers.PerReplicaMeanLinearRegression(),
                           "mirrored", str(tmp_path / "two"),
                           check_loss_scaling=False)
  assert helpers.max_weight_difference(one_w, two_w) > 100 * TIGHT
  # Summing two per-replica means doubles the reported loss (and the step).
  assert all(two > 1.3 * one for one, two in zip(one_loss, two_loss))


def test_regularization_losses_are_divided_by_replicas(tmp_path):
  class Regularized(helpers.LinearRegression):

    def build_model(self):
      model = super().build_model()
      model.layers[0].kernel_regularizer = None
      model.add_loss(lambda: 0.01 * tf.reduce_sum(
          tf.square(model.layers[0].kernel)))
      return model

  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  one_w, one_loss = _train(Regularized(), "one_device", str(tmp_path / "one"))
  two_w, two_loss = _train(Regularized(), "mirrored", str(tmp_path / "two"))
  assert helpers.max_weight_difference(one_w, two_w) < TIGHT
  assert one_loss == pytest.approx(two_loss, rel=1e-5)


def test_overrides_tells_a_replaced_hook_from_an_inherited_one():
  class Plain(trainer.Task):
    pass

  class Gathering(Plain):

    def preprocess_batch(self, batch, training, seed):
      return batch

  assert not task_lib.overrides(Plain(), "preprocess_batch")
  assert task_lib.overrides(Gathering(), "preprocess_batch")
  assert not task_lib.overrides(Gathering(), "train_step")


def _documented_train_step():
  """Returns the complete `train_step` override of docs/writing-a-task.md,
  as a function."""
  with open(os.path.join(helpers.REPO_ROOT, "docs", "writing-a-task.md")) as f:
    page = f.read()
  start = page.index("  def train_step(self, inputs, model, optimizer, "
                       "metrics=None):\n    features, labels = inputs\n"
                       "    with tf.GradientTape() as tape:\n      # float16")
  source = page[start:page.index("```", start)]
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_keras  # pylint: disable=g-import-not-at-top
  namespace = {"tf": tf, "tf_keras": tf_keras, "trainer": trainer}
  exec(textwrap.dedent(source), namespace)  # pylint: disable=exec-used
  return namespace["train_step"]


class _DocumentedOverride(helpers.LinearRegression):
  train_step = _documented_train_step()


def test_the_documented_train_step_override_is_replica_invariant(tmp_path):
  one_w, one_loss = _train(_DocumentedOverride(), "one_device",
                           str(tmp_path / "one"))
  two_w, two_loss = _train(_DocumentedOverride(), "mirrored",
                           str(tmp_path / "two"))
  assert helpers.max_weight_difference(one_w, two_w) < TIGHT
  assert one_loss == pytest.approx(two_loss, rel=1e-5)
  assert one_loss[-1] < one_loss[0] / 5
  penalties = helpers.read_scalars(str(tmp_path / "two" / "train"))["penalty"]
  assert [step for step, _ in penalties] == [10, 20, 30, 40]
  assert all(value > 0 for _, value in penalties)


def test_the_documented_train_step_override_trains_in_float16(tmp_path):
  runtime = trainer.RuntimeConfig(distribution_strategy="mirrored",
                                  num_cpu_devices=2, seed=1,
                                  mixed_precision_dtype="float16")
  config = trainer.TrainerConfig(train_steps=40, steps_per_loop=10,
                                 summary_interval=10, global_batch_size=32,
                                 checkpoint_interval=40)
  experiment.run(_DocumentedOverride(), "train", str(tmp_path), runtime, config)
  scalars = helpers.read_scalars(str(tmp_path / "train"))
  losses = [value for _, value in scalars["loss"]]
  assert losses[-1] < losses[0] / 5
  assert [value for _, value in scalars["loss_scale"]][-1] > 1


class _FlatLabels(helpers.LinearRegression):
  """Labels of shape [batch] against outputs [batch, 1]: `labels - outputs`
  broadcasts to [batch, batch]."""

  def build_inputs(self, training, input_context=None):
    return super().build_inputs(training, input_context).map(
        lambda x, y: (x, y[0]))


class _FlatLabelsSqueezed(_FlatLabels):
  """The same shapes, the outputs' trailing axis dropped before they meet
  the labels: per-example losses, nothing wrong."""

  def build_losses(self, labels, model_outputs, aux_losses=None):
    return tf.square(labels - tf.squeeze(model_outputs, -1))


BROADCAST = (r"^_FlatLabels\.build_losses: labels of shape \[{0}\] and "
             r"outputs of shape \[{0}, 1\] broadcast into a \[batch, batch\] "
             r"loss \(each example's loss mixes every label\): give the "
             r"labels the outputs' shape")


@pytest.mark.parametrize("strategy,per_replica", [("default", 32),
                                                  ("mirrored", 16)])
@pytest.mark.parametrize("run_eagerly", [False, True])
def test_labels_broadcast_against_outputs_stop_the_run(tmp_path, strategy,
                                                       per_replica,
                                                       run_eagerly):
  with pytest.raises(trainer.ConfigError,
                     match=BROADCAST.format(per_replica)):
    experiment.run(_FlatLabels(), "train", str(tmp_path),
                   trainer.RuntimeConfig(
                       distribution_strategy=strategy, seed=0,
                       num_cpu_devices=2 if strategy == "mirrored" else 0,
                       run_eagerly=run_eagerly),
                   trainer.TrainerConfig(train_steps=20, steps_per_loop=10,
                                         global_batch_size=32))
  assert tf.train.latest_checkpoint(str(tmp_path)) is None  # Nothing trained.


def test_labels_broadcast_in_evaluation_stop_it(tmp_path):
  with pytest.raises(trainer.ConfigError, match=BROADCAST.format("batch")):
    experiment.run(_FlatLabels(), "eval", str(tmp_path),
                   trainer.RuntimeConfig(seed=0),
                   trainer.TrainerConfig(eval_batch_size=60),
                   restore_dir=_trained(tmp_path / "trained"))


def _trained(model_dir) -> str:
  experiment.run(helpers.LinearRegression(), "train", str(model_dir),
                 trainer.RuntimeConfig(seed=0),
                 trainer.TrainerConfig(train_steps=10, steps_per_loop=10,
                                       global_batch_size=32))
  return str(model_dir)


def test_the_same_shapes_aligned_by_the_loss_train(tmp_path):
  results = experiment.run(
      _FlatLabelsSqueezed(), "train_and_eval", str(tmp_path),
      trainer.RuntimeConfig(seed=0),
      trainer.TrainerConfig(train_steps=200, steps_per_loop=100,
                            global_batch_size=32, eval_batch_size=64))
  # The labels' variance is 14.25; broadcast, the loss would stay near it.
  assert results["loss"] < 0.5
