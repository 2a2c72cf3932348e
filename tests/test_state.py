"""The training state: building it, its fingerprint, its finiteness."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import trainer
from trainer import errors
from trainer import state as state_lib

import helpers

# LinearRegression's batched (features, labels).
_SPEC = (tf.TensorSpec([None, 4], tf.float32),
         tf.TensorSpec([None, 1], tf.float32))


def _build(task, training=True, **settings):
  return state_lib.build(task, tf.distribute.get_strategy(), _SPEC,
                         trainer.TrainerConfig(**settings),
                         trainer.RuntimeConfig(), training=training)


def test_build_makes_a_built_model_and_an_optimizer_when_training():
  state = _build(helpers.LinearRegression())
  assert state.model.built and state.step() == 0
  assert state.optimizer is not None
  evaluated = _build(helpers.LinearRegression(), training=False)
  assert evaluated.optimizer is None


def test_build_takes_a_tools_own_optimizer_in_place_of_the_tasks():
  made = []

  def sgd():
    made.append(tf_keras.optimizers.SGD(0.5))
    return made[-1]

  state = state_lib.build(helpers.LinearRegression(learning_rate=0.1),
                          tf.distribute.get_strategy(), _SPEC,
                          trainer.TrainerConfig(), trainer.RuntimeConfig(),
                          training=True, optimizer_fn=sgd)
  assert made == [state.optimizer]
  assert float(state.optimizer.learning_rate) == 0.5


def test_fingerprint_follows_every_weight_and_finiteness_is_checked():
  state = _build(helpers.LinearRegression())
  before = state_lib.weights_fingerprint(state.model)
  assert len(before) == 16 and state.all_finite()
  assert state_lib.weights_fingerprint(state.model) == before
  bias = state.model.weights[-1]
  bias.assign(bias + 1.0)
  assert state_lib.weights_fingerprint(state.model) != before
  bias.assign(tf.fill(bias.shape, np.float32(np.nan)))
  assert not state.all_finite()


def test_batched_examples_are_named_for_build_inputs():
  model = _build(helpers.LinearRegression()).model
  batched = (tf.TensorSpec([None, 8, 4], tf.float32),)
  with pytest.raises(errors.ConfigError,
                     match=r"^`build_inputs` returns batched data: the model "
                     r"takes inputs of shape \(None, 4\)"):
    state_lib.check_input_ranks(model, batched)
