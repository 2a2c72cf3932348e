"""trainer.graph_code: the framework's step code is called by autograph as
written, and a Task's hooks, and its model's layers, are still converted."""

import pytest
import tensorflow as tf
# pylint: disable-next=g-direct-tensorflow-import
from tensorflow.python.autograph.impl import api as autograph_api
import tf_keras

import trainer
from trainer import experiment
from trainer import graph_code
from trainer.loop.runner import first_step_check
from trainer.loop.runner import runners
from trainer.loop.runner import source_shares
from trainer.loop.runner import summary_window
from trainer.model import gradients
from trainer.model import task as task_lib

import helpers


class _Never(tf_keras.layers.Layer):
  """A layer whose `call` branches on a tensor: autograph's to trace."""

  def call(self, inputs):
    if tf.reduce_max(tf.abs(inputs)) > 1e9:
      return inputs * 0.0
    return inputs


class _Branching(helpers.LinearRegression):
  """Every hook a step calls branches on a tensor (which traces only when
  autograph converts it), into branches never taken: it trains exactly as
  `LinearRegression` does."""

  def build_model(self):
    return tf_keras.Sequential([
        tf_keras.Input((4,)), _Never(),
        tf_keras.layers.Dense(8, activation="tanh"),
        tf_keras.layers.Dense(1)])

  def build_losses(self, labels, model_outputs, aux_losses=None):
    losses = super().build_losses(labels, model_outputs)
    if tf.reduce_max(tf.abs(labels)) > 1e9:
      losses = losses * 0.0
    return losses

  def compute_gradients(self, inputs, model, optimizer):
    loss, grads, outputs = super().compute_gradients(inputs, model,
                                                     optimizer)
    if loss < 0.0:
      grads = [tf.zeros_like(g) for g in grads]
    return loss, grads, outputs

  def process_metrics(self, metrics, labels, model_outputs):
    if tf.size(labels) > 0:
      super().process_metrics(metrics, labels, model_outputs)

  def train_step(self, inputs, model, optimizer, metrics=None):
    features, labels = inputs
    if tf.reduce_max(tf.abs(features)) > 1e9:
      features = features * 0.0
    return super().train_step((features, labels), model, optimizer, metrics)


@pytest.mark.parametrize("strategy", ["default", "mirrored"])
def test_hooks_and_layers_of_the_user_are_still_converted(tmp_path, strategy):
  runtime = trainer.RuntimeConfig(
      distribution_strategy=strategy, seed=0,
      num_cpu_devices=2 if strategy == "mirrored" else 0)
  config = trainer.TrainerConfig(train_steps=4, steps_per_loop=2,
                                 summary_interval=2, global_batch_size=16,
                                 eval_batch_size=16)
  for name, task in (("branching", _Branching()),
                     ("plain", helpers.LinearRegression())):
    experiment.run(task, "train", str(tmp_path / name), runtime, config)
  branching = helpers.checkpoint_weights(str(tmp_path / "branching"))
  plain = helpers.checkpoint_weights(str(tmp_path / "plain"))
  assert len(branching) == len(plain) == 4
  assert helpers.max_weight_difference(branching, plain) == 0.0


@pytest.mark.parametrize("function", [
    runners.TaskTrainer.train_step, runners.TaskTrainer._step,
    runners.TaskTrainer._next_batch, summary_window.SummaryWindow.add,
    summary_window.SummaryWindow._add_extra_scalars,
    first_step_check.FirstStepCheck.record,
    task_lib.Task.train_step, task_lib.Task.compute_gradients,
    task_lib.Task.process_metrics, helpers.LinearRegression.build_losses,
    gradients.accumulate, gradients.clip_and_apply, gradients.global_norm,
    gradients.per_example, source_shares.SourceShares.add,
    source_shares.worker_losses,
], ids=lambda function: function.__qualname__)
def test_the_framework_step_is_not_converted(function):
  # Converting them took ~1.7 s of a 1-step digits run's start.
  assert autograph_api.is_autograph_artifact(function)


def test_user_code_converts_only_while_tracing():
  def branching(x):
    return x * 2.0 if x > 0 else -x  # Python's `if` over a tensor.

  # Eagerly as written; traced with autograph, converted; traced without
  # autograph, as written (Python's `if` refuses a symbolic tensor).
  assert float(graph_code.user_code(branching)(tf.constant(3.0))) == 6.0
  assert float(tf.function(lambda x: graph_code.user_code(branching)(x))(
      tf.constant(-3.0))) == 3.0
  with pytest.raises(TypeError, match="tf.Tensor. as a Python .bool."):
    tf.function(lambda x: graph_code.user_code(branching)(x),
                autograph=False)(tf.constant(1.0))
