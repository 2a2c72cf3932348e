"""`trainer.loss_scaling`: a loss averaged per replica stops a new run on
several replicas at its first step; a correct one trains exactly as it would
without the check."""

import os

import pytest
import tensorflow as tf
import tf_keras

import trainer
from trainer import experiment
from trainer.model import loss_scaling

import helpers


def _train(task, model_dir, steps=20, run_eagerly=False, **overrides):
  runtime = trainer.RuntimeConfig(distribution_strategy="mirrored",
                                  num_cpu_devices=2, seed=1,
                                  run_eagerly=run_eagerly)
  settings = dict(train_steps=steps, steps_per_loop=10, summary_interval=10,
                  global_batch_size=32, checkpoint_interval=10)
  settings.update(overrides)
  config = trainer.TrainerConfig(**settings)
  return experiment.run(task, "train", model_dir, runtime, config)


@pytest.mark.parametrize("run_eagerly", [False, True])
def test_a_loss_averaged_per_replica_stops_at_the_first_step(tmp_path,
                                                             run_eagerly):
  with pytest.raises(trainer.ConfigError) as raised:
    _train(helpers.PerReplicaMeanLinearRegression(), str(tmp_path),
           run_eagerly=run_eagerly)
  _assert_twice_too_large(
      str(raised.value),
      "PerReplicaMeanLinearRegression.train_step's loss on the first step, "
      "summed over 2 replicas, is ")
  assert not [name for name in os.listdir(tmp_path)
              if name.startswith("ckpt")]


def _assert_twice_too_large(message: str, start: str) -> None:
  """`message` is the check's one line, starting with `start`, for a loss
  averaged over each of 2 replicas' batches."""
  assert message.startswith(start)
  ratio = float(message.split(": ")[1].split(" times")[0])
  assert ratio == pytest.approx(2.0, rel=1e-3)  # No dropout: exactly twice.
  assert message.endswith(
      "so it is averaged over each replica's batch and every gradient is 2 "
      "times too large; average over the GLOBAL batch: "
      "tf.nn.compute_average_loss(per_example_losses) "
      "(`trainer.check_loss_scaling=False` skips this check).")
  assert "\n" not in message


def test_off_it_trains_and_a_resumed_run_is_not_checked_again(tmp_path):
  task = helpers.PerReplicaMeanLinearRegression()
  _train(task, str(tmp_path), steps=10, check_loss_scaling=False)
  # Checked when the run was new (here: not at all); resuming costs nothing.
  _train(task, str(tmp_path), steps=20)
  assert helpers.checkpoint_step(str(tmp_path)) == 20


class _NormalizedRegression(helpers.LinearRegression):
  """A correct own step on a model with batch normalisation (and dropout,
  where `rate` is set)."""

  def __init__(self, rate: float = 0.0):
    super().__init__()
    self.rate = rate

  def build_model(self):
    layers = [tf_keras.Input((4,)), tf_keras.layers.Dense(16, "tanh"),
              tf_keras.layers.BatchNormalization()]
    if self.rate:
      layers.append(tf_keras.layers.Dropout(self.rate))
    return tf_keras.Sequential(layers + [tf_keras.layers.Dense(1)])

  def train_step(self, inputs, model, optimizer, metrics=None):
    features, labels = inputs
    with tf.GradientTape() as tape:
      outputs = model(features, training=True)
      loss = tf.nn.compute_average_loss(self.build_losses(labels, outputs))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return {"loss": loss}


def test_a_correct_step_trains_exactly_as_without_the_check(tmp_path):
  for name, check in (("checked", True), ("unchecked", False)):
    _train(_NormalizedRegression(), str(tmp_path / name), steps=10,
           check_loss_scaling=check)
  checked = helpers.checkpoint_numbers(str(tmp_path / "checked" / "ckpt-10"))
  unchecked = helpers.checkpoint_numbers(
      str(tmp_path / "unchecked" / "ckpt-10"))
  moving = [key for key in checked if "moving_mean" in key]
  assert moving  # The reference pass's batch statistics were put back.
  assert set(checked) == set(unchecked)
  assert all((checked[key] == unchecked[key]).all() for key in checked)


def test_dropout_does_not_make_a_correct_step_look_averaged(tmp_path):
  # Half the units dropped: the step's pass and the reference pass differ.
  _train(_NormalizedRegression(rate=0.5), str(tmp_path), steps=10)
  assert helpers.checkpoint_step(str(tmp_path)) == 10


@pytest.mark.parametrize("loss, total, count, stops", [
    (4.0, 200.0, 100.0, True),  # Twice the mean of 2.
    (2.1, 200.0, 100.0, False),  # The mean, give or take dropout.
    (3.0, 200.0, 100.0, False),  # Neither: not this mistake.
    (float("nan"), 200.0, 100.0, False),  # The guard names a NaN loss.
    (4.0, 0.0, 0.0, False),  # No reference (its pass could not be traced).
])
def test_check_stops_only_near_the_replica_count(loss, total, count, stops):
  if not stops:
    loss_scaling.check("Mine", 2, loss, total, count)
    return
  with pytest.raises(trainer.ConfigError, match=(
      r"^Mine.train_step's loss on the first step, summed over 2 replicas, "
      r"is 4: 2.00 times the global-batch mean of build_losses on the same "
      r"batch \(2\), ")):
    loss_scaling.check("Mine", 2, loss, total, count)


def test_applies_to_an_own_step_on_several_replicas():
  task = helpers.PerReplicaMeanLinearRegression()
  model = task.build_model()
  assert loss_scaling.applies(task, model, 2)
  assert not loss_scaling.applies(task, model, 1)
  assert not loss_scaling.applies(helpers.LinearRegression(), model, 2)
  # Several models: checked against their own step on one device.
  assert loss_scaling.applies(task, {"a": model, "b": model}, 2)
  assert not loss_scaling.applies(task, {"a": model, "b": model}, 1)


@pytest.mark.parametrize("steps_per_loop", [1, 5])
def test_the_first_loops_progress_line_reports_every_step(tmp_path, capsys,
                                                          steps_per_loop):
  # The checked step runs alone, then the loop's others: the line's mean
  # loss covers them all, as without the check.
  lines = {}
  for name, check in (("checked", True), ("unchecked", False)):
    _train(_NormalizedRegression(), str(tmp_path / name), steps=10,
           check_loss_scaling=check, steps_per_loop=steps_per_loop,
           summary_interval=10)
    lines[name] = [line.split("| loss ")[1].split()[0]
                   for line in capsys.readouterr().out.splitlines()
                   if line.startswith("train | step")]
  assert lines["checked"] == lines["unchecked"] and lines["checked"]


class _TwoModels(helpers.LinearRegression):
  """Two models, each with its own optimizer (as docs/writing-a-task.md's
  TinyGan): a regression and a critic of its outputs; `average` turns each
  model's per-example losses into its loss."""

  def __init__(self, average=tf.nn.compute_average_loss):
    super().__init__()
    self.average = average

  def build_model(self):
    return {"regression": super().build_model(),
            "critic": tf_keras.Sequential([tf_keras.Input((5,)),
                                           tf_keras.layers.Dense(1)])}

  def train_step(self, inputs, model, optimizer, metrics=None):
    features, labels = inputs
    with tf.GradientTape(persistent=True) as tape:
      outputs = model["regression"](features, training=True)
      logit = model["critic"](tf.concat([features, outputs], -1))[:, 0]
      regression_loss = self.average(self.build_losses(labels, outputs))
      critic_loss = self.average(tf.nn.softplus(logit))
    trainer.minimize(tape, regression_loss,
                     model["regression"].trainable_variables,
                     optimizer["regression"])
    trainer.minimize(tape, critic_loss, model["critic"].trainable_variables,
                     optimizer["critic"])
    return {"loss": regression_loss + critic_loss}


def _per_replica_mean(losses):
  return tf.reduce_mean(losses)


@pytest.mark.parametrize("run_eagerly", [False, True])
def test_two_models_averaged_per_replica_stop_at_the_first_step(tmp_path,
                                                                run_eagerly):
  with pytest.raises(trainer.ConfigError) as raised:
    _train(_TwoModels(average=_per_replica_mean), str(tmp_path),
           run_eagerly=run_eagerly)
  _assert_twice_too_large(
      str(raised.value),
      "_TwoModels.train_step's loss on the first step, on replica 1 of 2, "
      "is ")
  assert not [name for name in os.listdir(tmp_path)
              if name.startswith("ckpt")]


def test_two_correct_models_train_exactly_as_without_the_check(tmp_path,
                                                               capsys):
  out = {}
  for name, check in (("checked", True), ("unchecked", False)):
    _train(_TwoModels(), str(tmp_path / name), steps=10,
           check_loss_scaling=check)
    out[name] = capsys.readouterr().out
  # Checked: no line saying how to check it, nor that it was not.
  assert "scripts/check_task.py" not in out["checked"]
  assert "scripts/check_task.py" in out["unchecked"]
  checked = helpers.checkpoint_numbers(str(tmp_path / "checked" / "ckpt-10"))
  unchecked = helpers.checkpoint_numbers(
      str(tmp_path / "unchecked" / "ckpt-10"))
  assert set(checked) == set(unchecked)
  assert all((checked[key] == unchecked[key]).all() for key in checked)


@pytest.mark.parametrize("loss, reference, stops", [
    (2.0, 2.0, True),  # The replica's loss is its batch's mean: twice.
    (1.0, 2.0, False),  # Its share of the mean: right.
    (-2.0, -2.0, True),  # A negative loss, as a Wasserstein critic's.
    (2.0, None, False),  # No reference: the step did not run on one device.
    (2.0, 0.0, False),  # A reference of 0 says nothing.
    (float("nan"), 2.0, False),  # The guard names a NaN loss.
])
def test_check_several_stops_only_near_the_replica_count(loss, reference,
                                                         stops):
  if not stops:
    loss_scaling.check_several("Mine", 2, loss, reference)
    return
  with pytest.raises(trainer.ConfigError, match=(
      rf"^Mine.train_step's loss on the first step, on replica 1 of 2, is "
      rf"{loss:g}: 2.00 times its share \(1/2\) of what the same step "
      rf"reports for that replica's batch on one device \({reference:g}\), ")):
    loss_scaling.check_several("Mine", 2, loss, reference)


class _OnlyOnReplicas(_TwoModels):
  """A step that cannot run on one device."""

  def train_step(self, inputs, model, optimizer, metrics=None):
    if tf.distribute.get_replica_context().num_replicas_in_sync == 1:
      raise ValueError("needs several replicas")
    return super().train_step(inputs, model, optimizer, metrics)


def test_a_step_that_cannot_run_on_one_device_says_it_is_not_checked(
    tmp_path, capsys):
  _train(_OnlyOnReplicas(average=_per_replica_mean), str(tmp_path),
         steps=10)
  assert [line for line in capsys.readouterr().out.splitlines()
          if line.startswith("warning |")] == [
              "warning | _OnlyOnReplicas.train_step's loss scaling is not "
              "checked: its step could not run on one device for the "
              "reference (ValueError: needs several replicas); "
              "scripts/check_task.py with these gin files checks it against "
              "one device"]
  assert helpers.checkpoint_step(str(tmp_path)) == 10
