"""A mixture's sources counted per summary window, and their losses."""

import contextlib

import numpy as np
import orbit
import pytest
import tensorflow as tf

from trainer import errors
from trainer.data import inputs
from trainer.data import mixture
from trainer.loop.runner import runners
from trainer.loop.runner import source_shares
from trainer.model import gradients

import helpers


def test_shares_are_the_window_s_counts_over_their_sum_then_reset():
  shares = source_shares.SourceShares(
      mixture.Mixture({"a": 1.0, "b": 1.0, "c": 0.0}),
      contextlib.nullcontext)
  assert shares.read_and_reset() == {"mixture/a": 0.0, "mixture/b": 0.0,
                                     "mixture/c": 0.0}
  add = tf.function(shares.add)
  add(tf.constant([0, 0, 0, 1], tf.int32))
  # The counts, and no losses: the step reports none.
  np.testing.assert_array_equal(add(tf.constant([1, 1, 0, 0], tf.int32)),
                                [[5.0, 3.0, 0.0], [0.0, 0.0, 0.0]])
  assert shares.read_and_reset() == {"mixture/a": 0.625, "mixture/b": 0.375,
                                     "mixture/c": 0.0}
  add(tf.constant([2, 2], tf.int32))
  assert shares.read_and_reset() == {"mixture/a": 0.0, "mixture/b": 0.0,
                                     "mixture/c": 1.0}


def test_each_source_s_loss_is_the_mean_of_its_examples_losses():
  shares = source_shares.SourceShares(
      mixture.Mixture({"a": 1.0, "b": 1.0, "c": 1.0}),
      contextlib.nullcontext)
  add = tf.function(shares.add)
  add(tf.constant([0, 1, 0], tf.int32),
      tf.constant([1.0, 10.0, 2.0], tf.float64))
  np.testing.assert_array_equal(
      add(tf.constant([0, 1], tf.int32), tf.constant([6.0, 20.0], tf.float64)),
      [[3.0, 2.0, 0.0], [9.0, 30.0, 0.0]])
  assert shares.reports_losses
  # "c" had no example: no point in this window, rather than a made-up 0.
  assert shares.read_and_reset() == {
      "mixture/a": 0.6, "mixture/b": 0.4, "mixture/c": 0.0,
      "mixture/a/loss": 3.0, "mixture/b/loss": 15.0}
  add(tf.constant([2], tf.int32), tf.constant([0.5], tf.float64))
  assert shares.read_and_reset() == {
      "mixture/a": 0.0, "mixture/b": 0.0, "mixture/c": 1.0,
      "mixture/c/loss": 0.5}


def test_without_per_example_losses_the_summaries_hold_the_shares_only():
  shares = source_shares.SourceShares(mixture.Mixture({"a": 1.0}),
                                      contextlib.nullcontext)
  tf.function(shares.add)(tf.constant([0, 0], tf.int32))
  assert not shares.reports_losses
  assert shares.read_and_reset() == {"mixture/a": 1.0}


def test_losses_that_are_not_one_per_example_are_one_line():
  with pytest.raises(errors.ConfigError, match=(
      r"^Own.train_step returned `per_example_loss` of shape \(8, 2\): it "
      r"must hold one loss per example of the replica's batch, shape "
      r"\[8\]\.$")):
    source_shares.worker_losses(tf.distribute.get_strategy(),
                                tf.zeros([8, 2]), 8, "Own")


# Through the runner: the exact mean loss of each source's examples, on one
# device and on 2 replicas with micro-batches, from the default step or an
# own step that returns its per-example losses.

class _Own(helpers.ZeroMixedRegression):
  """An own `train_step` that opts in with its per-example losses."""

  def train_step(self, inputs, model, optimizer, metrics=None):
    features, labels = inputs
    with tf.GradientTape() as tape:
      losses = self.build_losses(labels, model(features))
      loss = tf.nn.compute_average_loss(losses)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return {"loss": loss, "per_example_loss": losses}


class _Silent(helpers.ZeroMixedRegression):
  """An own `train_step` without per-example losses."""

  def train_step(self, inputs, model, optimizer, metrics=None):
    return {"loss": _Own.train_step(self, inputs, model, optimizer)["loss"]}


def _input(task, strategy, batch=32):
  return inputs.DistributedInput(
      strategy, lambda context: task.build_inputs(True, context), batch,
      training=True, mixture=mixture.Mixture(task.rates, seed=0),
      task_name=type(task).__name__)


def _expected(task, steps, batch=32):
  """Each source's mean target squared over the first `steps` batches."""
  return helpers.source_losses(
      _input(task, tf.distribute.get_strategy(), batch).dataset, [steps])[0]


def _trained(task, strategy, steps, **options):
  with strategy.scope():
    model = task.build_model()
    optimizer = task.create_optimizer(None)
    global_step = orbit.utils.create_global_step()
  task_trainer = runners.TaskTrainer(
      task, model, optimizer, strategy, _input(task, strategy), global_step,
      step_options=gradients.StepOptions(**options))
  task_trainer.train(tf.constant(steps))
  return task_trainer.read_and_reset_metrics()


@pytest.mark.parametrize("replicas, micro_batches",
                         [(1, 1), (2, 2)])
def test_the_runner_gives_each_source_the_mean_loss_of_its_examples(
    replicas, micro_batches):
  task = helpers.ZeroMixedRegression()
  strategy = (tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
              if replicas == 2 else tf.distribute.get_strategy())
  results = _trained(task, strategy, 3, accumulation_steps=micro_batches)
  expected = _expected(task, 3)
  for name, value in expected.items():
    assert results[f"mixture/{name}/loss"] == pytest.approx(value, rel=1e-6)
  # The step's loss is the mean of the same per-example losses.
  shares = [results[f"mixture/{name}"] for name in expected]
  assert results["loss"] == pytest.approx(
      np.dot(shares, list(expected.values())), rel=1e-6)
  assert "per_example_loss" not in results


def test_an_own_train_step_opts_in_by_returning_its_per_example_losses():
  expected = _expected(_Own(), 2)
  results = _trained(_Own(), tf.distribute.MirroredStrategy(
      ["/cpu:0", "/cpu:1"]), 2)
  assert {name: results[f"mixture/{name}/loss"] for name in expected} == (
      pytest.approx(expected, rel=1e-6))
  silent = _trained(_Silent(), tf.distribute.get_strategy(), 2)
  assert "mixture/clean" in silent and not any(
      tag.endswith("/loss") for tag in silent)
