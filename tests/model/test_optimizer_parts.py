"""trainer.optimizer_parts: per-part optimizers on one model, read back from
the weights each part's update moved, from checkpoints and from summaries."""

import os

import gin
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import trainer
from trainer import errors
from trainer import experiment
from trainer.model import optimizer_parts

import helpers

LEARNING_RATE = 0.1


class TwoLayerRegression(helpers.ConfiguredRegression):
  """`LinearRegression` with named layers and seeded initialisers, so the
  starting weights are known; the optimizer is gin's."""

  def build_model(self):
    return tf_keras.Sequential([
        tf_keras.Input((4,)),
        tf_keras.layers.Dense(
            8, activation="tanh", name="hidden",
            kernel_initializer=tf_keras.initializers.GlorotUniform(seed=1)),
        tf_keras.layers.Dense(
            1, name="out",
            kernel_initializer=tf_keras.initializers.GlorotUniform(seed=2)),
    ])


def _initial_weights():
  model = TwoLayerRegression().build_model()
  return {w.name.split(":")[0]: w.numpy() for w in model.weights}


def _config(**overrides):
  settings = dict(train_steps=1, steps_per_loop=1, summary_interval=1,
                  global_batch_size=32, checkpoint_interval=1)
  settings.update(overrides)
  return trainer.TrainerConfig(**settings)


def _train(model_dir, bindings=(), runtime=None, **config):
  """Trains `TwoLayerRegression` in-process with gin `bindings`; returns the
  weights of the newest checkpoint by short name."""
  gin.clear_config()
  gin.parse_config(["optimizer.name = 'sgd'",
                    f"optimizer.learning_rate = {LEARNING_RATE}", *bindings])
  experiment.run(TwoLayerRegression(), "train", str(model_dir),
                 runtime or trainer.RuntimeConfig(seed=0), _config(**config))
  layers = {"model/layer_with_weights-0": "hidden",
            "model/layer_with_weights-1": "out"}
  weights = {}
  for name, value in helpers.checkpoint_weights(str(model_dir)).items():
    layer, weight = name.split("/.ATTRIBUTES")[0].rsplit("/", 1)
    weights[f"{layers[layer]}/{weight}"] = value
  return weights


PARTS = {"hidden": "^hidden/", "out": "^out/"}


def test_a_multiplier_scales_one_parts_update(tmp_path):
  initial = _initial_weights()
  whole = _train(tmp_path / "whole")
  split = _train(tmp_path / "split", optimizer_parts=PARTS,
                 learning_rate_multipliers={"hidden": 0.1})
  assert sorted(whole) == ["hidden/bias", "hidden/kernel", "out/bias",
                           "out/kernel"]
  for name in whole:
    moved_whole = whole[name] - initial[name]
    moved_split = split[name] - initial[name]
    assert np.abs(moved_whole).max() > 1e-4, name  # SGD moved it.
    factor = 0.1 if name.startswith("hidden/") else 1.0
    np.testing.assert_allclose(moved_split, factor * moved_whole, rtol=1e-4,
                               atol=1e-7, err_msg=name)


def test_a_part_gets_its_own_optimizer_from_its_gin_scope(tmp_path):
  initial = _initial_weights()
  whole = _train(tmp_path / "whole")
  split = _train(tmp_path / "split", ["out/optimizer.name = 'adam'"],
                 optimizer_parts=PARTS)
  # hidden: plain SGD, as in the run without parts.
  for name in ("hidden/kernel", "hidden/bias"):
    np.testing.assert_allclose(split[name], whole[name], rtol=1e-6)
  # out: Adam's first step moves every weight by the rate, against the
  # gradient's sign (m / sqrt(v) = g / |g|), whatever the gradient's size.
  for name in ("out/kernel", "out/bias"):
    moved = split[name] - initial[name]
    sgd_moved = whole[name] - initial[name]
    np.testing.assert_allclose(np.abs(moved), LEARNING_RATE, rtol=1e-3)
    assert (np.sign(moved) == np.sign(sgd_moved)).all()
  # Each part's slots are checkpointed under its name: Adam's for out only.
  names = tf.train.load_checkpoint(str(tmp_path / "split")
                                   ).get_variable_to_shape_map()
  assert any(n.startswith("optimizer/out/iter") for n in names)
  assert any("OPTIMIZER_SLOT/optimizer/out/m" in n for n in names)
  assert not any("OPTIMIZER_SLOT/optimizer/hidden" in n for n in names)


def test_per_part_training_resumes_exactly(tmp_path):
  bindings = ["out/optimizer.name = 'adam'",
              "hidden/learning_rate.schedule = 'cosine'",
              "hidden/learning_rate.decay_steps = 10"]
  straight = _train(tmp_path / "straight", bindings, optimizer_parts=PARTS,
                    train_steps=6)
  _train(tmp_path / "resumed", bindings, optimizer_parts=PARTS, train_steps=3)
  resumed = _train(tmp_path / "resumed", bindings, optimizer_parts=PARTS,
                   train_steps=6)
  for name in straight:
    np.testing.assert_array_equal(resumed[name], straight[name], name)
  # Each part's learning rate is summarised under its name.
  scalars = helpers.read_scalars(str(tmp_path / "straight" / "train"))
  assert scalars["learning_rate/out"][-1] == (6, pytest.approx(LEARNING_RATE))
  assert scalars["learning_rate/hidden"][-1][1] < LEARNING_RATE  # Decayed.


def test_parts_are_replica_invariant_and_loss_scaled_in_float16(tmp_path):
  config = dict(optimizer_parts=PARTS, learning_rate_multipliers={"out": 0.5},
                train_steps=5)
  one = _train(tmp_path / "one", runtime=trainer.RuntimeConfig(seed=0),
               **config)
  two = _train(tmp_path / "two", runtime=trainer.RuntimeConfig(
      seed=0, distribution_strategy="mirrored", num_cpu_devices=2), **config)
  assert helpers.max_weight_difference(one, two) < 1e-6
  # float16: one loss, so one loss scale over the parts, which skips the
  # overflowing first steps as it does for the model with one optimizer.
  float16 = trainer.RuntimeConfig(seed=0, mixed_precision_dtype="float16")
  half = _train(tmp_path / "half", runtime=float16, optimizer_parts=PARTS,
                train_steps=5)
  half_whole = _train(tmp_path / "half_whole", runtime=float16,
                      train_steps=5)
  assert helpers.max_weight_difference(half, half_whole) == 0.0
  assert "loss_scale" in helpers.read_tags(str(tmp_path / "half" / "train"))


@pytest.mark.parametrize("parts, message", [
    ({"hidden": "^hidden/", "out": "^nothing/"},
     r"^`trainer.optimizer_parts` pattern '\^nothing/' of part 'out' matches "
     r"no trainable variable; the model's are: hidden/kernel, hidden/bias, "
     r"out/kernel, out/bias\.$"),
    ({"hidden": "^hidden/", "all": "."},
     r"^variable hidden/kernel matches the patterns of parts 'hidden' and "
     r"'all' of `trainer.optimizer_parts`: two optimizers cannot own one "
     r"variable; make the patterns exclusive\.$"),
    ({"hidden": "^hidden/"},
     r"^`trainer.optimizer_parts` leaves 2 trainable variable\(s\) without "
     r"an optimizer: out/kernel, out/bias; add a part whose pattern matches "
     r"them\.$"),
])
def test_parts_that_do_not_split_the_model_are_one_line(tmp_path, parts,
                                                        message):
  with pytest.raises(errors.ConfigError, match=message):
    _train(tmp_path, optimizer_parts=parts)
  assert not os.path.exists(tmp_path / "checkpoint")


@pytest.mark.parametrize("settings, message", [
    (dict(optimizer_parts={"a": "("}),
     r"^`trainer.optimizer_parts` pattern '\(' of part 'a' is not a regular "
     r"expression: "),
    (dict(optimizer_parts={"a": "x"}, learning_rate_multipliers={"b": 2.0}),
     r"^`trainer.learning_rate_multipliers` names 'b', which is not one of "
     r"`trainer.optimizer_parts`: a\."),
    (dict(optimizer_parts={"a": "x"}, learning_rate_multipliers={"a": 0}),
     r"^`trainer.learning_rate_multipliers` 'a' \(0\) must be a positive "
     r"number\."),
    (dict(learning_rate_multipliers={"a": 2.0}),
     r"^`trainer.learning_rate_multipliers` needs `trainer.optimizer_parts`"),
    (dict(optimizer_parts={"a b": "x"}),
     r"^`trainer.optimizer_parts` name 'a b' must be a gin scope name"),
    (dict(optimizer_parts={}),
     r"^`trainer.optimizer_parts` \(\{\}\) must map part names to "),
])
def test_malformed_parts_are_one_line(settings, message):
  with pytest.raises(errors.ConfigError, match=message):
    trainer.TrainerConfig(**settings)


def test_assign_takes_names_without_the_device_suffix():
  variables = [tf.Variable(1.0, name="hidden/kernel"),
               tf.Variable(1.0, name="out/kernel")]
  owned = optimizer_parts.assign({"h": "^hidden/kernel$", "o": "^out"},
                                 variables)
  assert [v.name for v in owned["h"]] == ["hidden/kernel:0"]
  assert [v.name for v in owned["o"]] == ["out/kernel:0"]


# A whole train.py run (~10 s); the parts are tested in-process above.
@pytest.mark.slow
def test_the_shipped_parts_train_digits_from_the_command_line(tmp_path):
  # As a user runs it: from their own directory, a relative --model_dir.
  result = helpers.run_cli([
      f"--gin_file={helpers.REPO_ROOT}/gin/digits.gin",
      f"--gin_file={helpers.REPO_ROOT}/gin/features/optimizer_parts.gin",
      "--gin_param=trainer.train_steps=400", "--model_dir=runs/parts"],
      cwd=str(tmp_path))
  assert result.returncode == 0, result.stderr[-3000:]
  lines = result.stdout.splitlines()
  assert ("optimizer | part backbone: 4 variable(s), 18,816 parameters, "
          "Adam, rate 0.0001 (x0.1)") in lines
  assert ("optimizer | part head: 4 variable(s), 75,146 parameters, SGD, "
          "rate 0.05") in lines
  model_dir = tmp_path / "runs" / "parts"
  scalars = helpers.read_scalars(str(model_dir / "train"))
  assert scalars["learning_rate/backbone"][-1][1] == pytest.approx(1e-4)
  assert scalars["learning_rate/head"][-1][1] == pytest.approx(0.05)
  assert helpers.read_scalars(str(model_dir / "eval"))["accuracy"][-1][1] >= 0.9
  names = tf.train.load_checkpoint(str(model_dir)).get_variable_to_shape_map()
  assert any("OPTIMIZER_SLOT/optimizer/head/momentum" in n for n in names)
  assert any("OPTIMIZER_SLOT/optimizer/backbone/m" in n for n in names)


def test_a_pattern_that_matches_nothing_is_one_line_from_the_cli(tmp_path):
  result = helpers.run_cli([
      f"--gin_file={helpers.REPO_ROOT}/gin/digits.gin",
      f"--gin_file={helpers.REPO_ROOT}/gin/features/optimizer_parts.gin",
      "--gin_param=trainer.optimizer_parts = "
      "{'backbone': '^conv', 'head': '^(hidden|logits)/', 'stem': '^stem/'}",
      "--model_dir=runs/parts"], cwd=str(tmp_path))
  assert result.returncode == 2, result.stderr[-3000:]
  assert result.stderr.splitlines() == [
      "train.py: error: `trainer.optimizer_parts` pattern '^stem/' of part "
      "'stem' matches no trainable variable; the model's are: conv1/kernel, "
      "conv1/bias, conv2/kernel, conv2/bias, hidden/kernel, hidden/bias and 2 "
      "more."]
  assert not os.path.exists(tmp_path / "runs" / "parts" / "checkpoint")


def test_parts_keep_ema_and_rollback_slots(tmp_path):
  # EMA wraps the parts; `on_nonfinite='rollback'` makes every part's slots
  # before the first step, so a checkpoint holds them all from step 0.
  weights = _train(tmp_path, ["out/optimizer.name = 'adam'",
                              "ema.decay = 0.5"],
                   optimizer_parts=PARTS, on_nonfinite="rollback",
                   train_steps=3)
  reader = tf.train.load_checkpoint(str(tmp_path))
  names = reader.get_variable_to_shape_map()
  kernel = "model/layer_with_weights-1/kernel/"
  average = reader.get_tensor(
      kernel + ".OPTIMIZER_SLOT/optimizer/average/.ATTRIBUTES/VARIABLE_VALUE")
  assert np.abs(average - weights["out/kernel"]).max() > 1e-4  # Averaged.
  assert kernel + (".OPTIMIZER_SLOT/optimizer/ema_base_optimizer/out/m/"
                   ".ATTRIBUTES/VARIABLE_VALUE") in names
  assert "optimizer/ema_base_optimizer/hidden/iter/.ATTRIBUTES/" \
      "VARIABLE_VALUE" in names
  assert all(np.isfinite(value).all() for value in weights.values())
