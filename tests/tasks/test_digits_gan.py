"""tasks.digits_gan: the shipped conditional GAN through `train.py`, as a
user runs it: its measured quality, and a SIGKILL and a SIGTERM in the
middle of a run with three models and three optimizers."""

import re
import signal

import pytest

import helpers

GAN = f"--gin_file={helpers.REPO_ROOT}/gin/digits_gan.gin"


def _fingerprint(text):
  return re.search(r"weights fingerprint (\w+)", text).group(1)


@pytest.mark.slow
def test_generated_digits_are_the_class_asked_for(tmp_path):
  # The shipped configuration (6,000 steps), from the user's directory.
  result = helpers.run_cli([GAN, "--model_dir=runs/gan"], cwd=str(tmp_path),
                           timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  evals = helpers.read_scalars(str(tmp_path / "runs" / "gan" / "eval"))
  step, accuracy = evals["classifier_accuracy"][-1]
  assert step == 6000 and accuracy >= 0.9  # Chance: 0.1.
  assert evals["real_accuracy"][-1][1] >= 0.95  # The judge knows digits.


@pytest.mark.slow
def test_sigkill_and_sigterm_resume_three_optimizers_bit_identical(tmp_path):
  args = [GAN, "--mode=train", "--gin_param=runtime.deterministic=True",
          "--gin_param=trainer.train_steps=600",
          "--gin_param=trainer.checkpoint_interval=100"]
  straight = helpers.run_cli([*args, "--model_dir=straight"],
                             cwd=str(tmp_path))
  assert straight.returncode == 0, straight.stderr[-3000:]

  run = helpers.TrainProcess([*args, "--model_dir=stopped"],
                             cwd=str(tmp_path))
  try:
    run.wait_for(r"saved checkpoint stopped/ckpt-200")
    run.process.send_signal(signal.SIGKILL)
  finally:
    run.close()
  run = helpers.TrainProcess([*args, "--model_dir=stopped"],
                             cwd=str(tmp_path))
  try:
    run.wait_for(r"restored checkpoint stopped/ckpt-\d+ at step")
    run.wait_for(r"saved checkpoint stopped/ckpt-400")
    run.process.send_signal(signal.SIGTERM)
    assert run.finish() == 42
  finally:
    run.close()
  assert re.search(r"preempted at step \d+: checkpoint saved",
                   run.stderr.splitlines()[-1])
  resumed = helpers.run_cli([*args, "--model_dir=stopped"], cwd=str(tmp_path))
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert _fingerprint(resumed.stdout) == _fingerprint(straight.stdout)
