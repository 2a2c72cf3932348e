"""trainer.run_report: the header and closing block of a run, read from a
real `train.py` run of the digits task started from another directory, and
nothing on stderr that is not about the run."""

import re

import numpy as np
import pytest

from trainer.report import run_report

import helpers


def test_results_are_formatted_like_the_summary():
  assert run_report.format_results(
      {"loss": np.float32(0.019820749759674072), "accuracy": 0.99444443,
       "samples": np.zeros([80, 80, 1]), "bad": float("nan")}) == (
           "accuracy 0.9944 | bad nan | loss 0.0198 | samples [80x80x1]")


def test_a_held_out_sets_results_are_marked():
  assert run_report.format_results(
      {"clean/accuracy": 0.5, "test/accuracy": 0.25, "tested/loss": 1.0},
      held_out=("test",)) == ("clean/accuracy 0.5000 | test/accuracy 0.2500 "
                              "(held out) | tested/loss 1.0000")


def test_orbits_evaluation_speed_is_not_a_result():
  # Orbit adds it to a fixed-length evaluation's output (`--dry_run` runs
  # one step); the eval summaries keep it, the result lines do not.
  assert run_report.format_results(
      {"accuracy": 0.5, "steps_per_second": 1.5896}) == "accuracy 0.5000"


@pytest.mark.slow
def test_a_digits_run_says_what_it_is_and_what_it_left(tmp_path):
  args = ["--gin_file=gin/digits.gin", "--model_dir=runs/d",
          "--gin_param=trainer.train_steps=200",
          "--gin_param=trainer.validation_interval=100",
          "--gin_param=trainer.checkpoint_interval=100",
          "--gin_param=best_checkpoint.metric='accuracy'",
          "--gin_param=best_checkpoint.higher_is_better=True",
          "--gin_param=export.at_end=True"]
  first = helpers.run_cli(args, cwd=str(tmp_path))
  assert first.returncode == 0, first.stderr[-3000:]
  # Nothing on stderr: no CUDA probe line on this GPU-less machine, no raw
  # absl line, no warning printed twice.
  assert first.stderr == ""
  lines = [l for l in first.stdout.splitlines()
           if not l.startswith("train | step ")]
  assert lines[:3] == [
      "run | DigitsClassification, train_and_eval in runs/d: new",
      "run | default strategy, 1 replica (CPU) | batch 64, 64 per replica "
      "| float32",
      "run | to step 200, evaluating every 100 steps and at the end | "
      "tensorboard --logdir runs/d"]
  evals = [l for l in lines if l.startswith("eval |")]
  assert len(evals) == 2
  for line, step in zip(evals, (100, 200)):
    assert re.fullmatch(rf"eval \| step {step} \| accuracy 0\.\d{{4}} \| "
                        r"loss \d\.\d{4} \| \d+\.\d s", line), line
  closing = lines[-4:]
  assert re.fullmatch(r"train \| finished at step 200 \| 200 steps in "
                      r"\d+\.\d s \| weights fingerprint [0-9a-f]{16}",
                      closing[0]), closing
  assert closing[1] == ("saved | checkpoint runs/d/ckpt-200 | export "
                        "runs/d/export/200")
  best = max((float(l.split()[6]), -int(l.split()[3])) for l in evals)
  assert closing[2] == (f"best eval | accuracy {best[0]:.4f} at step "
                        f"{-best[1]}, in runs/d/best")
  final = evals[-1].split(" | ")[2:4]
  assert closing[3] == "final eval | " + " | ".join(final)
  assert (tmp_path / "runs" / "d" / "export" / "200" /
          "saved_model.pb").exists()
  # The whole run fits on one screen.
  assert len(first.stdout.splitlines()) <= 24

  # Resumed on 2 replicas: the header says so.
  resumed = helpers.run_cli(
      args[:2] + ["--gin_param=trainer.train_steps=300",
                  "--gin_file=gin/runtime/cpu_mirrored.gin"],
      cwd=str(tmp_path))
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert resumed.stderr == ""
  out = resumed.stdout.splitlines()
  start = out.index("run | DigitsClassification, train_and_eval in runs/d: "
                    "resuming from ckpt-200, step 200")
  assert out[start + 1] == ("run | mirrored, 2 replicas (CPU:0, CPU:1) | "
                            "batch 64, 32 per replica | float32")
  # digits.gin evaluates every 500 steps: only at the end here.
  assert out[start + 2] == ("run | to step 300, evaluating at the end | "
                            "tensorboard --logdir runs/d")
  assert any(re.fullmatch(r"train \| finished at step 300 \| 100 steps in "
                          r".*", l) for l in out)

  evaluated = helpers.run_cli(args[:2] + ["--mode=eval"], cwd=str(tmp_path))
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  out = evaluated.stdout.splitlines()
  assert "run | DigitsClassification, eval in runs/d: evaluating ckpt-300" in (
      out)
  assert out[-1].startswith("final eval | accuracy ")
  assert sum(l.startswith("eval | step 300 | accuracy ") for l in out) == 1


@pytest.mark.parametrize("dtype,expected", [
    ("float16", "mixed float16 (dynamic loss scale)"),
    ("bfloat16", "mixed bfloat16")])
def test_the_header_names_the_precision(dtype, expected):
  import trainer  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  lines = run_report.header(
      task_name="T", mode="train", model_dir="m",
      strategy=tf.distribute.get_strategy(),
      runtime=trainer.RuntimeConfig(mixed_precision_dtype=dtype),
      config=trainer.TrainerConfig(gradient_accumulation_steps=2,
                                   global_batch_size=64),
      num_workers=1, restored_path=None, step=0, training=True,
      evaluating=False)
  assert lines[1] == (f"run | default strategy, 1 replica (CPU) | batch 64, "
                      f"64 per replica in 2 micro-batches | {expected}")
  assert lines[2] == "run | to step 1000 | tensorboard --logdir m"


def test_a_new_run_of_an_own_train_step_on_replicas_says_how_to_check_it():
  import trainer  # pylint: disable=g-import-not-at-top

  def lines(replicas, restored):

    class _Strategy:  # What the header reads of a strategy.
      num_replicas_in_sync = replicas
      extended = None

    return run_report.header(
        task_name="Mine", mode="train", model_dir="m", strategy=_Strategy(),
        runtime=trainer.RuntimeConfig(distribution_strategy="mirrored"),
        config=trainer.TrainerConfig(global_batch_size=64), num_workers=1,
        restored_path=restored, step=0, training=True, evaluating=False,
        unchecked_train_step=True)

  assert lines(2, None)[-1] == (
      "run | Mine.train_step is your own: on 2 replicas its loss must be this "
      "replica's share of the global-batch mean (tf.nn.compute_average_loss);"
      " scripts/check_task.py with these gin files checks it against one "
      "device")
  assert len(lines(1, None)) == 3  # One replica: nothing to check.
  assert len(lines(2, "m/ckpt-10")) == 3  # Said when the run was new.
