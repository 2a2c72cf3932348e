"""Task runners: eager execution, XLA, whole-set eval aggregation and
evaluation on EMA weights."""

import numpy as np
import pytest
import tensorflow as tf

import trainer
from trainer import experiment
from trainer import optimization
from tasks import digits

import helpers


def _config(**overrides):
  settings = dict(train_steps=12, steps_per_loop=4, summary_interval=4,
                  global_batch_size=16, eval_batch_size=24)
  settings.update(overrides)
  return trainer.TrainerConfig(**settings)


def test_run_eagerly_runs_python_every_step_with_the_same_result(tmp_path):
  class Recording(helpers.LinearRegression):
    calls = []

    def train_step(self, inputs, model, optimizer, metrics=None):
      Recording.calls.append(tf.executing_eagerly())
      return super().train_step(inputs, model, optimizer, metrics)

  experiment.run(Recording(), "train", str(tmp_path / "eager"),
                 trainer.RuntimeConfig(run_eagerly=True, seed=0), _config())
  assert Recording.calls == [True] * 12
  Recording.calls.clear()
  experiment.run(Recording(), "train", str(tmp_path / "graph"),
                 trainer.RuntimeConfig(seed=0), _config())
  # Traced (once or twice: autograph may trace the loop body twice), not run.
  assert 1 <= len(Recording.calls) <= 2 and not any(Recording.calls)
  assert helpers.max_weight_difference(
      helpers.checkpoint_weights(str(tmp_path / "eager")),
      helpers.checkpoint_weights(str(tmp_path / "graph"))) < 1e-5


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


@pytest.mark.parametrize("strategy",
                         ["one_device", "mirrored", "central_storage"])
def test_enable_xla_matches_the_default_run(tmp_path, strategy):
  for name, xla in (("xla", True), ("plain", False)):
    experiment.run(
        helpers.LinearRegression(), "train", str(tmp_path / name),
        trainer.RuntimeConfig(
            distribution_strategy=strategy, enable_xla=xla, seed=0,
            num_cpu_devices=2 if strategy == "mirrored" else 0), _config())
  assert helpers.max_weight_difference(
      helpers.checkpoint_weights(str(tmp_path / "xla")),
      helpers.checkpoint_weights(str(tmp_path / "plain"))) < 1e-5


def test_xla_on_several_replicas_refuses_a_custom_train_step(tmp_path):
  with pytest.raises(trainer.ConfigError,
                     match="^PerReplicaMeanLinearRegression overrides "
                     "`Task.train_step`, which then does its own gradient "
                     "handling: .* `runtime.enable_xla` on several replicas "
                     "need the default step.$"):
    experiment.run(helpers.PerReplicaMeanLinearRegression(), "train",
                   str(tmp_path),
                   trainer.RuntimeConfig(distribution_strategy="mirrored",
                                         num_cpu_devices=2, enable_xla=True),
                   _config())


class _WithDropout(helpers.LinearRegression):
  """tf_keras `Dropout`: a stateful random op no checkpoint holds."""

  def build_model(self):
    import tf_keras  # pylint: disable=g-import-not-at-top
    return tf_keras.Sequential([tf_keras.Input((4,)),
                                tf_keras.layers.Dense(8, "tanh"),
                                tf_keras.layers.Dropout(0.5),
                                tf_keras.layers.Dense(1)])


class _StatelessDropout(helpers.LinearRegression):
  """Dropout from `tf.random.stateless_uniform`, seeded by the step."""

  def train_step(self, inputs, model, optimizer, metrics=None):
    features, labels = inputs
    seed = tf.stack([tf.cast(optimizer.iterations, tf.int32), 7])
    keep = tf.random.stateless_uniform(tf.shape(features), seed) > 0.1
    return super().train_step((tf.where(keep, features, 0.0), labels),
                              model, optimizer, metrics)


def test_deterministic_warns_about_stateful_random_ops(tmp_path, capsys):
  runtime = trainer.RuntimeConfig(deterministic=True)
  experiment.run(_WithDropout(), "train", str(tmp_path / "a"), runtime,
                 _config())
  out = capsys.readouterr().out
  assert ("warning | runtime.deterministic: the train step uses stateful "
          "random ops (RandomUniform (") in out
  experiment.run(_StatelessDropout(), "train", str(tmp_path / "b"), runtime,
                 _config())
  assert "stateful random ops" not in capsys.readouterr().out


def test_deterministic_seeds_with_zero_by_default(tmp_path):
  for name in ("a", "b"):
    experiment.run(helpers.LinearRegression(), "train", str(tmp_path / name),
                   trainer.RuntimeConfig(deterministic=True), _config())
  assert helpers.max_weight_difference(
      helpers.checkpoint_weights(str(tmp_path / "a")),
      helpers.checkpoint_weights(str(tmp_path / "b"))) == 0.0


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
  ema = optimization.EmaConfig(decay=0.9)
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
