"""Optimizers, schedules and EMA from gin, built by Model Garden's factory."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import trainer
from trainer import experiment
from trainer.model import ema as ema_lib
from trainer.model import optimization

import helpers


def _build(schedule=None, train_steps=100, **optimizer):
  return optimization.build_optimizer(
      optimization.OptimizerConfig(**optimizer),
      schedule or optimization.ScheduleConfig(), train_steps)


def _rates(optimizer, steps):
  schedule = optimization.get_learning_rate(optimizer)
  return [float(schedule(step)) for step in steps]


@pytest.mark.parametrize("settings,cls,hyper", [
    (dict(name="sgd", momentum=0.9, nesterov=True), "SGD",
     dict(momentum=0.9, nesterov=True)),
    (dict(name="adam", beta_1=0.8, epsilon=1e-6), "Adam",
     dict(beta_1=0.8, epsilon=1e-6)),
    (dict(name="adamw", weight_decay=0.01,
          exclude_from_weight_decay=["bias"]), "AdamWeightDecay",
     dict(weight_decay_rate=0.01, _exclude_from_weight_decay=["bias"],
          gradient_clip_norm=0.0)),
    (dict(name="lamb", weight_decay=0.02), "LAMB",
     dict(weight_decay_rate=0.02)),
    (dict(name="lars", momentum=0.8, weight_decay=1e-4), "LARS",
     dict(momentum=0.8, weight_decay_rate=1e-4)),
    (dict(name="rmsprop", momentum=0.5), "RMSprop", dict(momentum=0.5)),
    (dict(name="adagrad"), "Adagrad", {}),
])
def test_each_optimizer_is_model_gardens_with_its_settings(settings, cls,
                                                           hyper):
  optimizer = _build(learning_rate=0.1, **settings)
  assert type(optimizer).__name__ == cls
  assert isinstance(optimizer, tf_keras.optimizers.legacy.Optimizer)
  for name, value in hyper.items():
    found = getattr(optimizer, name, None)
    if found is None:
      found = optimizer._get_hyper(name)  # pylint: disable=protected-access
    if isinstance(value, float):
      found = float(tf.convert_to_tensor(found))
      assert found == pytest.approx(value), name
    else:
      assert found == value, name


def test_schedules_with_warmup_reach_the_peak_and_decay_to_the_end():
  steps = [0, 5, 10, 55, 100]
  cosine = _build(optimization.ScheduleConfig(
      schedule="cosine", warmup_steps=10, end_learning_rate=0.01),
                  learning_rate=0.1, name="sgd")
  # Linear warm-up from 0 to the peak, then a half cosine to the end rate.
  assert _rates(cosine, steps) == pytest.approx(
      [0.0, 0.05, 0.1, 0.01 + 0.09 * 0.5, 0.01], abs=1e-6)
  linear = _build(optimization.ScheduleConfig(
      schedule="linear", warmup_steps=10, warmup_learning_rate=0.02),
                  learning_rate=0.1, name="sgd")
  assert _rates(linear, steps) == pytest.approx(
      [0.02, 0.06, 0.1, 0.05, 0.0], abs=1e-6)
  polynomial = _build(optimization.ScheduleConfig(
      schedule="polynomial", power=2.0), learning_rate=0.1, name="sgd")
  assert _rates(polynomial, [0, 50, 100]) == pytest.approx(
      [0.1, 0.025, 0.0], abs=1e-6)
  exponential = _build(optimization.ScheduleConfig(
      schedule="exponential", decay_steps=10, decay_rate=0.5),
                       learning_rate=0.1, name="sgd")
  assert _rates(exponential, [0, 10, 20]) == pytest.approx(
      [0.1, 0.05, 0.025], abs=1e-6)
  constant = _build(learning_rate=0.3, name="sgd")
  assert float(tf.convert_to_tensor(
      optimization.get_learning_rate(constant))) == pytest.approx(0.3)


def test_stepwise_divides_by_ten_or_takes_the_given_rates():
  default = _build(optimization.ScheduleConfig(
      schedule="stepwise", boundaries=[30, 60]), learning_rate=0.1,
                   name="sgd")
  assert _rates(default, [0, 30, 31, 60, 61]) == pytest.approx(
      [0.1, 0.1, 0.01, 0.01, 0.001])
  given = _build(optimization.ScheduleConfig(
      schedule="stepwise", boundaries=[10], values=[0.5, 0.2]),
                 learning_rate=0.5, name="sgd")
  assert _rates(given, [10, 11]) == pytest.approx([0.5, 0.2])


@pytest.mark.parametrize("make,message", [
    (lambda: optimization.OptimizerConfig(name="adam", momentum=0.9),
     "`optimizer.momentum` does not apply to 'adam', which takes: beta_1, "
     "beta_2, epsilon."),
    (lambda: optimization.OptimizerConfig(name="adamx"),
     "`optimizer.name` ('adamx') must be one of: sgd, adam, adamw, lamb, "
     "lars, rmsprop, adagrad."),
    (lambda: optimization.OptimizerConfig(learning_rate=0),
     "`optimizer.learning_rate` (0) must be a positive number."),
    (lambda: optimization.ScheduleConfig(schedule="stepwise"),
     "`learning_rate.boundaries` ([]) must be increasing positive steps for "
     "'stepwise'."),
    (lambda: optimization.ScheduleConfig(schedule="stepwise",
                                         boundaries=[5], values=[1.0]),
     "`learning_rate.values` has 1 rates; 'stepwise' with 1 boundaries "
     "needs 2."),
    (lambda: optimization.ScheduleConfig(schedule="cosine", values=[1.0]),
     "`learning_rate.boundaries` and `values` apply to 'stepwise' only, not "
     "'cosine'."),
    (lambda: _build(optimization.ScheduleConfig(schedule="cosine",
                                                warmup_steps=100)),
     "`learning_rate.warmup_steps` (100) leaves no step to decay in "
     "`trainer.train_steps` (100)."),
    (lambda: _build(name="adam", options={"nesterov": True}),
     "Model Garden cannot build optimizer 'adam' with {'nesterov': True}: "
     "Unexpected keyword argument passed to optimizer: nesterov."),
    (lambda: ema_lib.EmaConfig(decay=1.0),
     "`ema.decay` (1.0) must be in (0, 1), or None."),
])
def test_bad_settings_are_one_line_errors(make, message):
  with pytest.raises(trainer.ConfigError) as raised:
    make()
  assert str(raised.value).splitlines()[0].startswith(message)


def test_adamw_decays_all_but_the_excluded_variables():
  model = tf_keras.Sequential([tf_keras.Input((2,)),
                               tf_keras.layers.Dense(1, name="dense")])
  model.layers[0].kernel.assign([[1.0], [2.0]])
  model.layers[0].bias.assign([3.0])
  optimizer = _build(name="adamw", learning_rate=0.1, weight_decay=0.5,
                     exclude_from_weight_decay=["bias"])
  zeros = [tf.zeros_like(v) for v in model.trainable_variables]
  optimizer.apply_gradients(zip(zeros, model.trainable_variables))
  # Decoupled decay: w -= lr * rate * w (Adam's own update is 0 here).
  np.testing.assert_allclose(model.layers[0].kernel.numpy(),
                             [[0.95], [1.9]], rtol=1e-6)
  np.testing.assert_allclose(model.layers[0].bias.numpy(), [3.0])


def test_learning_rate_is_written_every_loop_and_follows_the_schedule(
    tmp_path):
  config = trainer.TrainerConfig(
      train_steps=40, steps_per_loop=10, summary_interval=20,
      checkpoint_interval=40, global_batch_size=32,
      optimizer=optimization.OptimizerConfig(name="sgd", learning_rate=0.1),
      learning_rate=optimization.ScheduleConfig(schedule="linear",
                                                warmup_steps=10))
  experiment.run(helpers.ConfiguredRegression(), "train", str(tmp_path),
                 trainer.RuntimeConfig(seed=0), config)
  rates = helpers.read_scalars(str(tmp_path / "train"))["learning_rate"]
  # A schedule is written after every loop, not only with the summaries
  # (every 20 steps): the rate of the step to come.
  assert rates == [(10, pytest.approx(0.1)), (20, pytest.approx(0.1 * 2 / 3)),
                   (30, pytest.approx(0.1 / 3)), (40, pytest.approx(0.0))]


def test_reference_batch_size_scales_every_rate(tmp_path, capsys):
  config = trainer.TrainerConfig(
      train_steps=10, steps_per_loop=10, summary_interval=10,
      checkpoint_interval=10, global_batch_size=64,
      optimizer=optimization.OptimizerConfig(name="sgd", learning_rate=0.1),
      learning_rate=optimization.ScheduleConfig(reference_batch_size=256))
  experiment.run(helpers.ConfiguredRegression(), "train", str(tmp_path),
                 trainer.RuntimeConfig(seed=0), config)
  assert "learning rate | x0.25 for global batch 64 (rates are written for " \
         "256)" in capsys.readouterr().out
  rates = helpers.read_scalars(str(tmp_path / "train"))["learning_rate"]
  assert rates == [(10, pytest.approx(0.025))]
