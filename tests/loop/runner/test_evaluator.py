"""`TaskEvaluator`: whole-set eval aggregation (Model Garden's contract) and
evaluation on EMA weights."""

import numpy as np
import pytest
import tensorflow as tf

import trainer
from trainer import experiment
from trainer.model import ema as ema_lib
from trainer.model import optimization
from tasks import digits

import helpers


def _config(**overrides):
  settings = dict(train_steps=12, steps_per_loop=4, summary_interval=4,
                  global_batch_size=16, eval_batch_size=24)
  settings.update(overrides)
  return trainer.TrainerConfig(**settings)


@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_aggregate_logs_sees_every_eval_example_once(tmp_path, strategy):
  class Aggregating(helpers.LinearRegression):
    """Reports the largest absolute error over the whole eval set."""

    def validation_step(self, inputs, model, metrics=None):
      logs = super().validation_step(inputs, model, metrics)
      logs["errors"] = tf.abs(inputs[1] - model(inputs[0]))[:, 0]
      return logs

    def aggregate_logs(self, state, step_logs):  # Model Garden's contract.
      if state is None:
        state = []
      state.extend(t.numpy() for t in step_logs["errors"])
      return state

    def reduce_aggregated_logs(self, aggregated_logs, global_step=None):
      errors = np.concatenate(aggregated_logs)
      return {"max_error": errors.max(), "count": float(errors.size)}

  task = Aggregating(num_examples=100)  # Eval batches of 24: partial last.
  runtime = trainer.RuntimeConfig(
      distribution_strategy=strategy, seed=0,
      num_cpu_devices=2 if strategy == "mirrored" else 0)
  output = experiment.run(task, "train_and_eval", str(tmp_path), runtime,
                          _config())
  assert output["count"] == 100.0
  assert output["max_error"] >= output["mae"] > 0


class _ConfusionDigits(digits.DigitsClassification):
  """Digits with a confusion matrix over the whole eval set."""

  def validation_step(self, inputs, model, metrics=None):
    logs = super().validation_step(inputs, model, metrics)
    logs["labels"] = inputs[1]
    logs["predicted"] = tf.argmax(model(inputs[0], training=False), axis=-1)
    return logs

  def aggregate_logs(self, state, step_logs):  # Model Garden's contract.
    if state is None:
      state = np.zeros([10, 10], np.int64)
    for labels, predicted in zip(step_logs["labels"], step_logs["predicted"]):
      np.add.at(state, (labels.numpy(), predicted.numpy()), 1)
    return state

  def reduce_aggregated_logs(self, aggregated_logs, global_step=None):
    return {"examples": float(aggregated_logs.sum()),
            "matrix_accuracy": float(np.trace(aggregated_logs) /
                                     aggregated_logs.sum())}


def test_a_confusion_matrix_over_the_whole_eval_set(tmp_path):
  # 360 eval images in batches of 128 over 2 replicas: the last batch is
  # partial and one replica's share of it is short.
  output = experiment.run(
      _ConfusionDigits(), "train_and_eval", str(tmp_path),
      trainer.RuntimeConfig(distribution_strategy="mirrored",
                            num_cpu_devices=2, seed=0),
      _config(train_steps=100, steps_per_loop=50, summary_interval=50,
              global_batch_size=64, eval_batch_size=128))
  assert output["examples"] == 360.0
  assert output["matrix_accuracy"] == pytest.approx(output["accuracy"])
  assert output["accuracy"] > 0.5


@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_evaluation_uses_the_ema_weights(tmp_path, strategy):
  task = helpers.ConfiguredRegression()
  sgd = optimization.OptimizerConfig(name="sgd", learning_rate=0.1)
  ema = ema_lib.EmaConfig(decay=0.9)
  runtime = trainer.RuntimeConfig(
      distribution_strategy=strategy, seed=0,
      num_cpu_devices=2 if strategy == "mirrored" else 0)
  output = experiment.run(task, "train_and_eval", str(tmp_path), runtime,
                          _config(optimizer=sgd, ema=ema))
  # The same checkpoint evaluated again, in eval mode (which builds the
  # optimizer to restore the averages), and without EMA.
  again = experiment.run(task, "eval", str(tmp_path), runtime,
                         _config(optimizer=sgd, ema=ema))
  raw = experiment.run(task, "eval", str(tmp_path), runtime,
                       _config(optimizer=sgd))
  assert again["loss"] == pytest.approx(output["loss"], rel=1e-6)
  # By hand: the averaged weights of the checkpoint on the eval set.
  model = task.build_model()
  reader = tf.train.load_checkpoint(str(tmp_path))
  for index, layer in enumerate(model.layers):
    for name in ("kernel", "bias"):
      getattr(layer, name).assign(reader.get_tensor(
          f"model/layer_with_weights-{index}/{name}/.OPTIMIZER_SLOT/"
          "optimizer/average/.ATTRIBUTES/VARIABLE_VALUE"))
  features, labels = next(iter(task.build_inputs(False).batch(1000)))
  by_hand = float(tf.reduce_mean(task.build_losses(labels, model(features))))
  assert output["loss"] == pytest.approx(by_hand, rel=1e-5)
  assert abs(raw["loss"] - output["loss"]) > 1e-3
