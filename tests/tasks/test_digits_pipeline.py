"""The shipped pipelined digits job (`gin/digits_pipeline.gin`), run as a
user runs it: through train.py."""


import pytest

import helpers

PIPELINE = "--gin_file=gin/digits_pipeline.gin"
UNPIPELINED = ["--gin_param=pipeline.boundaries=None",
               "--gin_param=pipeline.num_microbatches=1"]

@pytest.mark.slow
def test_the_shipped_pipeline_trains_on_two_devices(tmp_path):
  run = helpers.run_cli(
      [PIPELINE, f"--model_dir={tmp_path / 'run'}",
       "--gin_param=trainer.train_steps=100",
       "--gin_param=trainer.validation_interval=100"])
  assert run.returncode == 0, run.stderr[-3000:]
  assert ("pipeline | 2 stages: flatten..hidden2 on /device:CPU:0 | "
          "hidden3..logits on /device:CPU:1; 4 micro-batch(es)"
          in run.stdout), run.stdout
  assert ("placement | /device:CPU:0: 4 variable(s), 24,832 parameters "
          "(hidden1/kernel, hidden1/bias, hidden2/kernel, hidden2/bias)"
          in run.stdout)
  assert helpers.checkpoint_step(str(tmp_path / "run")) == 100


@pytest.mark.slow
def test_the_shipped_pipeline_reaches_the_bar_resumes_whole_and_back(
    tmp_path):
  # As a user: from another directory, a relative model_dir.
  common = [PIPELINE, "--model_dir=runs/pipe"]
  first = helpers.run_cli(common + ["--gin_param=export.at_end=True"],
                          cwd=str(tmp_path))
  assert first.returncode == 0, first.stderr[-3000:]
  accuracy = helpers.final_accuracy(first.stdout)
  assert accuracy >= 0.95, first.stdout[-2000:]

  # Its SavedModel serves on a host of one device.
  served = helpers.serve_digits_export(
      tmp_path / "runs" / "pipe" / "export" / "1000")
  assert served.returncode == 0, served.stderr[-3000:]
  assert "devices 1" in served.stdout
  assert round(float(served.stdout.split("accuracy ")[1]), 4) == accuracy

  # The pipelined checkpoint resumes whole, on one device ...
  second = helpers.run_cli(
      common + UNPIPELINED + ["--gin_param=trainer.train_steps=1100"],
      cwd=str(tmp_path))
  assert second.returncode == 0, second.stderr[-3000:]
  assert "restored checkpoint runs/pipe/ckpt-1000 at step 1000" in (
      second.stdout)
  assert "pipeline |" not in second.stdout
  assert helpers.final_accuracy(second.stdout) >= 0.95

  # ... and back.
  third = helpers.run_cli(common + ["--gin_param=trainer.train_steps=1200"],
                          cwd=str(tmp_path))
  assert third.returncode == 0, third.stderr[-3000:]
  assert "restored checkpoint runs/pipe/ckpt-1100 at step 1100" in (
      third.stdout)
  assert "pipeline | 2 stages" in third.stdout
  assert helpers.checkpoint_step(str(tmp_path / "runs" / "pipe")) == 1200


def test_a_bad_micro_batch_count_is_one_line_and_exit_2(tmp_path):
  run = helpers.run_cli([PIPELINE, f"--model_dir={tmp_path / 'run'}",
                         "--gin_param=pipeline.num_microbatches=3"])
  assert run.returncode == 2, run.stderr[-3000:]
  assert run.stderr.strip().splitlines()[-1] == (
      "train.py: error: `pipeline.num_microbatches` (3) does not divide the "
      "64 example(s) of each step (`trainer.global_batch_size` per replica "
      "and accumulation step) into equal micro-batches.")
  assert not (tmp_path / "run").exists()
