"""How KerasModelTask calls a data function: the input context only to the
parameter meant for it, the others left to gin; a parameter nothing gives
is one line naming it."""

from typing import Optional

import gin
import numpy as np
import pytest
import tensorflow as tf

from tasks import data_functions
from tasks import digits
from tasks import keras_digits
from tasks import keras_model
from trainer import errors

CONTEXT = tf.distribute.InputContext(2, 1, 2)


def split_examples(training):
  """A user's data function: one function, the split chosen by gin."""
  return tf.data.Dataset.from_tensor_slices(digits.load_split(training))


gin.external_configurable(split_examples, "split_examples")


def test_the_context_goes_by_name_or_annotation_only():
  calls = []

  def by_name(input_context=None):
    calls.append(input_context)
    return "by name"

  def by_type(ctx: Optional[tf.distribute.InputContext], shards=3):
    calls.append((ctx, shards))
    return "by type"

  def by_string(context: "tf.distribute.InputContext"):  # Postponed.
    calls.append(context)
    return "by string"

  def with_default(training=True):
    calls.append(training)
    return "default"

  for function in (by_name, by_type, by_string, with_default):
    data_functions.call("setting", function, CONTEXT)
  assert calls == [CONTEXT, (CONTEXT, 3), CONTEXT, True]
  assert [data_functions.context_parameter(f) for f in (
      by_name, by_type, by_string, with_default)] == [
          "input_context", "ctx", "context", None]


def test_scoped_gin_bindings_choose_each_set_s_split():
  # As the user bound it: the eval set was the training split (the
  # truthy InputContext given as `training`).
  gin.parse_config(["train/split_examples.training = True",
                    "eval/split_examples.training = False"])
  task = keras_model.KerasModelTask(
      model=keras_digits.digits_keras_model, loss="mse",
      train_data=gin.get_configurable("train/split_examples"),
      eval_data=gin.get_configurable("eval/split_examples"))
  for training in (True, False):
    labels = [int(y) for _, y in task.build_inputs(
        training, tf.distribute.InputContext()).as_numpy_iterator()]
    np.testing.assert_array_equal(labels, digits.load_split(training)[1])


def test_a_parameter_nothing_gives_is_one_line():
  with pytest.raises(errors.ConfigError) as raised:
    keras_model.KerasModelTask(
        model=keras_digits.digits_keras_model, loss="mse",
        train_data=keras_digits.digits_train_examples,
        eval_data=gin.get_configurable("eval/split_examples")).build_inputs(
            False, CONTEXT)
  assert str(raised.value) == (
      "`KerasModelTask.eval_data` (split_examples) has the required "
      "parameter `training`, which nothing gives: bind it in gin "
      "(`split_examples.training = ...`; scoped, `eval/split_examples."
      "training = ...` with `@eval/split_examples`, where the sets differ) "
      "or give it a default; only a parameter named `input_context` or "
      "annotated `tf.distribute.InputContext` is given the input context.")

  def two(ctx, seed):
    del ctx, seed

  with pytest.raises(errors.ConfigError, match=(
      r"^`setting` \(two\) has the required parameters `ctx`, `seed`, which "
      r"nothing gives: bind it in gin \(`two.ctx = ...`")):
    data_functions.call("setting", two, CONTEXT)


def test_a_type_error_of_the_function_s_own_is_its_own():
  def broken(training=True):
    raise TypeError(f"'training' is {training!r}")

  with pytest.raises(TypeError, match="^'training' is True$"):
    data_functions.call("setting", broken, CONTEXT)
