"""Batch and learning-rate rescaling for another replica count."""

import pytest
import tensorflow as tf
import tf_keras

import trainer
from trainer import experiment
from trainer.model import scaling

import helpers


def _config(**overrides):
  settings = dict(global_batch_size=64, eval_batch_size=32,
                  reference_replicas=4)
  settings.update(overrides)
  return trainer.TrainerConfig(**settings)


def test_keep_per_replica_batch_scales_batches_and_learning_rate():
  config, factor = scaling.rescale(
      _config(batch_scaling="keep_per_replica_batch"), num_replicas=2)
  assert (config.global_batch_size, config.eval_batch_size) == (32, 16)
  assert factor == 0.5


def test_keep_global_batch_and_off_change_nothing():
  for rule in (None, "keep_global_batch"):
    config, factor = scaling.rescale(_config(batch_scaling=rule), 2)
    assert config.global_batch_size == 64 and factor == 1.0


def test_batch_that_cannot_be_kept_is_a_config_error():
  with pytest.raises(trainer.ConfigError, match="cannot keep its per-replica"):
    scaling.rescale(_config(batch_scaling="keep_per_replica_batch",
                            global_batch_size=6), 1)


def test_bad_rule_is_a_config_error():
  with pytest.raises(trainer.ConfigError, match="`trainer.batch_scaling`"):
    _config(batch_scaling="linear")


def test_scale_learning_rate_constant_and_schedule():
  constant = tf_keras.optimizers.SGD(0.2)
  scaling.scale_learning_rate(constant, 0.5)
  assert float(constant.learning_rate) == pytest.approx(0.1)
  schedule = tf_keras.optimizers.schedules.PiecewiseConstantDecay(
      [10], [1.0, 0.1])
  scheduled = tf_keras.optimizers.Adam(schedule)
  scaling.scale_learning_rate(scheduled, 2.0)
  assert float(scheduled._learning_rate(tf.constant(5))) == pytest.approx(2.0)
  assert float(scheduled._learning_rate(tf.constant(50))) == pytest.approx(0.2)


def test_run_logs_and_applies_the_rescaling(tmp_path, capsys):
  experiment.run(
      helpers.LinearRegression(), "train", str(tmp_path),
      trainer.RuntimeConfig(distribution_strategy="mirrored",
                            num_cpu_devices=2, seed=0),
      trainer.TrainerConfig(train_steps=10, steps_per_loop=10,
                            summary_interval=10, global_batch_size=64,
                            eval_batch_size=64, reference_replicas=4,
                            batch_scaling="keep_per_replica_batch"))
  assert ("scaling | 2 replica(s), reference 4: global batch 32, eval batch "
          "32, learning rate x0.5") in capsys.readouterr().out
  learning_rates = helpers.read_scalars(str(tmp_path / "train"))[
      "learning_rate"]
  assert learning_rates == [(10, pytest.approx(0.05))]
