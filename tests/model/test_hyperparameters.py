"""`hyperparameters`: the configured values put back over a restore, read
after a real step."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from trainer.model import hyperparameters
from trainer.model import optimization


def _adam(rate, **settings):
  """Model Garden's legacy Adam, as `optimizer.*` builds it."""
  return optimization.build_optimizer(
      optimization.OptimizerConfig(name="adam", learning_rate=rate,
                                   **settings),
      optimization.ScheduleConfig(), train_steps=10)


def _saved(tmp_path, optimizer):
  """Trains `w` one step with `optimizer`, saves both; returns the path."""
  weight = tf.Variable([1.0, -2.0])
  optimizer.apply_gradients([(tf.constant([0.5, 0.5]), weight)])
  return tf.train.Checkpoint(optimizer=optimizer, w=weight).save(
      str(tmp_path / "ckpt"))


def _resumed(path, optimizer, assign):
  """Restores `path` into `optimizer` and a new `w`, takes one step; returns
  how far `w` moved and the rate the optimizer holds after the step."""
  weight = tf.Variable([0.0, 0.0])
  configured = hyperparameters.configured(optimizer)
  tf.train.Checkpoint(optimizer=optimizer, w=weight).restore(path)
  replaced = hyperparameters.assign(configured) if assign else []
  before = weight.numpy()
  optimizer.apply_gradients([(tf.constant([0.5, 0.5]), weight)])
  moved = float(np.max(np.abs(weight.numpy() - before)))
  rate = optimization.get_learning_rate(optimizer)
  return moved, float(rate.numpy()), replaced


def test_a_restore_puts_the_checkpoints_rate_back_without_assign(tmp_path):
  path = _saved(tmp_path, _adam(1e-3))
  moved, rate, _ = _resumed(path, _adam(1e-12), assign=False)
  assert rate == pytest.approx(1e-3)  # The trap: the old rate trains.
  assert moved > 1e-4


def test_the_configured_hyperparameters_hold_after_the_first_step(tmp_path):
  path = _saved(tmp_path, _adam(1e-3))
  moved, rate, replaced = _resumed(path, _adam(1e-12, beta_1=0.5),
                                   assign=True)
  assert rate == np.float32(1e-12)
  assert moved < 1e-9
  assert replaced == [("beta_1", pytest.approx(0.9), 0.5),
                      ("learning_rate", pytest.approx(1e-3), 1e-12)]


def test_a_newer_optimizers_rate_variable_is_assigned_too(tmp_path):
  path = _saved(tmp_path, tf_keras.optimizers.SGD(0.1))
  moved, rate, replaced = _resumed(path, tf_keras.optimizers.SGD(1e-12),
                                   assign=True)
  assert rate == np.float32(1e-12)
  assert moved < 1e-9
  assert replaced == [("learning_rate", pytest.approx(0.1),
                       pytest.approx(1e-12))]


def test_schedules_are_not_variables_and_stay_as_built():
  optimizer = optimization.build_optimizer(
      optimization.OptimizerConfig(name="sgd", learning_rate=0.1),
      optimization.ScheduleConfig(schedule="cosine"), train_steps=10)
  (owner, values), = hyperparameters.configured(optimizer).values
  assert owner is optimizer
  assert "learning_rate" not in dict(values)
  assert hyperparameters.configured(None).values == ()


def test_each_models_optimizer_keeps_its_own_settings(tmp_path):
  built = {"generator": _adam(2e-4), "discriminator": _adam(1e-3)}
  configured = hyperparameters.configured(built)
  assert [dict(values)["learning_rate"] for _, values in configured.values
          ] == [pytest.approx(2e-4), pytest.approx(1e-3)]
  weights = {name: tf.Variable([1.0]) for name in built}
  for name, optimizer in built.items():
    optimizer.apply_gradients([(tf.constant([0.5]), weights[name])])
    optimizer.learning_rate = 0.5  # As a checkpoint's values would be.
  assert hyperparameters.assign(configured) == [
      ("learning_rate", 0.5, pytest.approx(2e-4)),
      ("learning_rate", 0.5, pytest.approx(1e-3))]
  assert [float(optimization.get_learning_rate(o).numpy())
          for o in built.values()] == [pytest.approx(2e-4),
                                       pytest.approx(1e-3)]
