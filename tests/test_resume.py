"""Exact resume after SIGKILL: a run killed at a random moment and restarted
ends with the same weights and optimizer state, bit for bit, as a run that
was never interrupted (`runtime.deterministic=True`): digits on one device
and 2 replicas, a model split over 2 devices, a Task with several models
and optimizers, a model pipelined over 2 devices. Real processes. (The tf.data service's batches come in no
reproducible order: its campaign, in test_data_service.py, checks the
resume step instead.)"""

import random
import time

import numpy as np
import pytest

import helpers


# The paths the campaign covers beside digits: a model split over 2 devices
# and a Task with three models and optimizers (the conditional GAN).
GIN_FILES = {"one_device": "gin/digits.gin", "mirrored": "gin/digits.gin",
             "split_model": "gin/split_digits.gin",
             "several_models": "gin/digits_gan.gin",
             "pipeline": "gin/digits_pipeline.gin"}


def _args(strategy, train_steps, model_dir):
  args = [f"--gin_file={GIN_FILES[strategy]}",
          "--gin_param=runtime.deterministic=True",
          "--gin_param=trainer.steps_per_loop=10",
          "--gin_param=trainer.summary_interval=10",
          "--gin_param=trainer.checkpoint_interval=20",
          f"--gin_param=trainer.train_steps={train_steps}",
          "--mode=train", f"--model_dir={model_dir}"]
  if strategy == "mirrored":
    args.append("--gin_file=gin/runtime/cpu_mirrored.gin")
  return args


@pytest.mark.parametrize("strategy,seed", [
    pytest.param("one_device", 1, marks=pytest.mark.slow),
    pytest.param("mirrored", 1, marks=pytest.mark.slow),
    pytest.param("one_device", 2, marks=pytest.mark.slow),
    pytest.param("mirrored", 2, marks=pytest.mark.slow),
    pytest.param("one_device", 3, marks=pytest.mark.slow),
    pytest.param("split_model", 1, marks=pytest.mark.slow),
    pytest.param("split_model", 2, marks=pytest.mark.slow),
    pytest.param("several_models", 1, marks=pytest.mark.slow),
    pytest.param("several_models", 2, marks=pytest.mark.slow),
    pytest.param("pipeline", 1, marks=pytest.mark.slow),
])
def test_sigkill_at_a_random_moment_then_restart_is_exact(
    tmp_path, strategy, seed):
  model_dir = tmp_path / "killed"
  killed = helpers.TrainProcess(_args(strategy, 100000, model_dir))
  try:
    killed.wait_for(r"saved checkpoint .*ckpt-20$", timeout=120)
    time.sleep(random.Random(seed).uniform(0.0, 1.5))
    killed.process.kill()
  finally:
    killed.close()
  saved = helpers.checkpoint_step(str(model_dir))
  assert saved >= 20

  final = saved + 40
  resumed = helpers.TrainProcess(_args(strategy, final, model_dir))
  assert resumed.finish() == 0, resumed.stderr[-2000:]
  assert f"restored checkpoint {model_dir}/ckpt-{saved} at step {saved}" in (
      resumed.output)
  straight = helpers.TrainProcess(_args(strategy, final, tmp_path / "straight"))
  assert straight.finish() == 0, straight.stderr[-2000:]

  ours = helpers.checkpoint_numbers(str(model_dir))
  reference = helpers.checkpoint_numbers(str(tmp_path / "straight"))
  assert sorted(ours) == sorted(reference)
  # Adam's two slots per weight (`<weight>/.OPTIMIZER_SLOT/optimizer/m` and
  # `v`, or `.../optimizer/<model>/m` for several) are compared too.
  weights = [n for n in ours
             if n.startswith("model/") and ".OPTIMIZER_SLOT/" not in n]
  slots = [n for n in ours if ".OPTIMIZER_SLOT/optimizer/" in n]
  assert weights and len(slots) == 2 * len(weights), sorted(ours)
  for name in reference:
    if name == "save_counter/.ATTRIBUTES/VARIABLE_VALUE":
      continue  # Counts saves, which differ by design.
    np.testing.assert_array_equal(ours[name], reference[name], err_msg=name)
