"""Mixed precision end to end: float16 with loss scaling, bfloat16."""

import os

import pytest

import trainer
from tasks import digits
from trainer import experiment

import helpers


def _digits_config(**overrides):
  settings = dict(train_steps=200, steps_per_loop=100, summary_interval=100,
                  global_batch_size=64, eval_batch_size=120)
  settings.update(overrides)
  return trainer.TrainerConfig(**settings)


# float16 convolutions have no fast CPU kernels (emulated): the run is
# kept to 200 steps, 2 summary windows; digits passes 0.95 by step 100.
@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_mixed_precision_digits_reaches_the_bar(tmp_path, dtype):
  output = experiment.run(
      digits.DigitsClassification(), "train_and_eval", str(tmp_path),
      trainer.RuntimeConfig(mixed_precision_dtype=dtype, seed=0),
      _digits_config())
  assert output["accuracy"] >= 0.95
  weights = helpers.checkpoint_weights(str(tmp_path))
  assert all(w.dtype == "float32" for w in weights.values())
  train = helpers.read_scalars(os.path.join(str(tmp_path), "train"))
  if dtype == "float16":
    # Dynamic scaling starts at 2**15 and doubles after 2000 good steps.
    assert [v for _, v in train["loss_scale"]] == [32768.0] * 2
  else:
    assert "loss_scale" not in train


def test_overflow_halves_the_dynamic_loss_scale(tmp_path):
  class Overflowing(helpers.LinearRegression):
    """A loss so large that float16 gradients overflow at 2**15."""

    def build_losses(self, labels, model_outputs, aux_losses=None):
      return 1e6 * super().build_losses(labels, model_outputs)

  experiment.run(Overflowing(), "train", str(tmp_path),
                 trainer.RuntimeConfig(mixed_precision_dtype="float16",
                                       seed=0),
                 trainer.TrainerConfig(train_steps=20, steps_per_loop=10,
                                       summary_interval=10,
                                       global_batch_size=32))
  scales = [v for _, v in helpers.read_scalars(
      os.path.join(str(tmp_path), "train"))["loss_scale"]]
  assert scales[0] < 32768.0  # Halved on each overflowing step.
  assert scales[-1] <= scales[0]


def test_fixed_loss_scale_is_reported(tmp_path):
  experiment.run(helpers.LinearRegression(), "train", str(tmp_path),
                 trainer.RuntimeConfig(mixed_precision_dtype="float16",
                                       loss_scale=256, seed=0),
                 trainer.TrainerConfig(train_steps=10, steps_per_loop=10,
                                       summary_interval=10,
                                       global_batch_size=32))
  train = helpers.read_scalars(os.path.join(str(tmp_path), "train"))
  assert train["loss_scale"] == [(10, 256.0)]
