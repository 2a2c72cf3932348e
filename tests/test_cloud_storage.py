"""Runs whose model_dir is a gs:// bucket, on a real GCS emulator.

`tests/gcs_emulator.py` starts fake-gcs-server on 127.0.0.1 behind a proxy
that answers only the two storage host names (`gcs_emulator` and
`gcs_bucket` in conftest.py). Every run here starts in an empty working
directory with a HOME of its own (another machine's view): whatever the
framework writes must be in the bucket, and a rerun from another empty
directory must find it there.
"""

import csv
import io
import os
import signal
import re
import subprocess
import sys
import time

import pytest
import tensorflow as tf

import helpers
from tasks import digits
from tasks import fake_data
from trainer.storage import files

pytestmark = pytest.mark.slow

_GIN = os.path.join(helpers.REPO_ROOT, "gin")
_DIGITS = [
    f"--gin_file={_GIN}/digits.gin",
    f"--gin_file={_GIN}/features/best_checkpoint.gin",
    # Patience 3 over three evaluations: it records, it does not stop.
    f"--gin_file={_GIN}/features/early_stopping.gin",
    *(f"--gin_param=trainer.{name}={value}" for name, value in (
        ("train_steps", 60), ("steps_per_loop", 10),
        ("checkpoint_interval", 20), ("validation_interval", 20),
        ("summary_interval", 10))),
    # Seeded, deterministic ops: two runs of it give the same weights.
    "--gin_param=runtime.deterministic=True"]


def _machine(tmp_path, name):
  """An empty working directory and HOME: a fresh machine's view."""
  directory = tmp_path / name
  (directory / "home").mkdir(parents=True)
  (directory / "cwd").mkdir()
  return str(directory / "cwd"), {"HOME": str(directory / "home")}


def _local_files(cwd):
  """Everything under a run's working directory."""
  return [os.path.join(directory, name)
          for directory, _, names in os.walk(cwd) for name in names]


def _bucket_files(url):
  return sorted(os.path.relpath(os.path.join(directory, name), url)
                .replace(os.sep, "/")
                for directory, _, names in tf.io.gfile.walk(url)
                for name in names)


def _rows(text):
  return [(row["step"], row["split"]) for row in csv.DictReader(
      io.StringIO(text))]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """The digits run never stopped, on a local disk."""
  model_dir = str(tmp_path_factory.mktemp("reference") / "run")
  done = helpers.run_cli([*_DIGITS, f"--model_dir={model_dir}"])
  assert done.returncode == 0, done.stderr[-2000:]
  return model_dir


def test_a_digits_run_keeps_every_file_in_the_bucket_and_resumes_elsewhere(
    gcs_bucket, reference, tmp_path):
  """SIGTERM on one machine, the rerun on another: the same weights as a
  run never stopped (on a local disk), the records continued, not started
  over, and no file on either machine."""
  model_dir = f"{gcs_bucket}/runs/digits"

  cwd, env = _machine(tmp_path, "first")
  run = helpers.TrainProcess([*_DIGITS, f"--model_dir={model_dir}"],
                             env=env, cwd=cwd)
  try:
    run.wait_for(r"saved checkpoint .*ckpt-20$", timeout=180)
    run.process.send_signal(signal.SIGTERM)
    assert run.process.wait(timeout=120) == 42
  finally:
    run.close()
  assert _local_files(cwd) == []

  cwd, env = _machine(tmp_path, "second")
  resumed = helpers.run_cli([*_DIGITS, f"--model_dir={model_dir}"], cwd=cwd,
                            env=env)
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert _local_files(cwd) == []
  assert "restored checkpoint" in resumed.stdout

  assert helpers.max_weight_difference(
      helpers.checkpoint_weights(model_dir),
      helpers.checkpoint_weights(reference)) == 0.0
  # The records are the uninterrupted run's: best step and value, early
  # stopping's evaluations, and one metrics row per step and split (none
  # written twice by the resume).
  assert files.read_json(f"{model_dir}/best/best.json") == files.read_json(
      f"{reference}/best/best.json")
  early = files.read_json(f"{model_dir}/early_stopping.json")
  assert early == files.read_json(f"{reference}/early_stopping.json")
  assert early is not None
  rows = _rows(files.read_text(f"{model_dir}/metrics.csv"))
  assert rows == _rows(files.read_text(f"{reference}/metrics.csv"))
  assert len(rows) == len(set(rows))
  stored = _bucket_files(model_dir)
  assert "operative_config.gin" in stored
  assert not [name for name in stored if files.TEMPORARY_PREFIX in name]
  # One best checkpoint (older ones pruned), its export and the final
  # export, each complete and servable from the bucket.
  best_step = files.read_json(f"{model_dir}/best/best.json")["step"]
  assert sorted({name.split(".")[0] for name in stored
                 if name.startswith("best/ckpt-")}) == [
                     f"best/ckpt-{best_step}"]
  images = digits.load_split(training=False)[0][:4]
  for export in (f"{model_dir}/export/60",
                 f"{model_dir}/best/export/{best_step}"):
    assert files.complete(export)
    served = tf.saved_model.load(export).signatures["serving_default"]
    outputs = served(features=tf.constant(images))["outputs"]
    assert outputs.shape == (len(images), 10)


def test_killed_then_evaluated_warm_started_and_plotted_from_the_bucket(
    gcs_bucket, reference, tmp_path):
  """SIGKILL and a rerun elsewhere end as the run never stopped; a
  continuous evaluator on another machine skips every checkpoint the run
  evaluated; a warm start reads a gs:// checkpoint;
  plot_metrics reads and writes the bucket."""
  model_dir = f"{gcs_bucket}/runs/digits"
  train = [*_DIGITS, f"--model_dir={model_dir}"]
  cwd, env = _machine(tmp_path, "first")
  run = helpers.TrainProcess(train, env=env, cwd=cwd)
  helpers.kill_after_first_save(run, model_dir, seed=0, spread=1.0)
  cwd, env = _machine(tmp_path, "second")
  resumed = helpers.run_cli(train, cwd=cwd, env=env)
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert helpers.max_weight_difference(
      helpers.checkpoint_weights(model_dir),
      helpers.checkpoint_weights(reference)) == 0.0
  assert not [name for name in _bucket_files(model_dir)
              if "_temp" in name or files.TEMPORARY_PREFIX in name]

  # The run's evaluations are recorded in the bucket: an evaluator on
  # another machine evaluates none of them again.
  evaluate = [*_DIGITS, "--mode=continuous_eval", f"--model_dir={model_dir}"]
  cwd, env = _machine(tmp_path, "third")
  again = helpers.run_cli(evaluate, cwd=cwd, env=env)
  assert again.returncode == 0, again.stderr[-2000:]
  assert ("continuous_eval | 3 checkpoint(s) already evaluated, up to step "
          "60") in again.stdout.splitlines()
  assert not [line for line in again.stdout.splitlines()
              if line.startswith("eval | step ")]
  assert files.read_json(f"{model_dir}/eval/evaluated.json") is not None

  warm = helpers.run_cli([
      *_DIGITS, f"--gin_file={_GIN}/features/warm_start.gin",
      f"--gin_param=INIT_CHECKPOINT='{model_dir}'",
      "--gin_param=trainer.train_steps=10",
      f"--model_dir={gcs_bucket}/runs/warm"], cwd=cwd, env=env)
  assert warm.returncode == 0, warm.stderr[-2000:]
  assert [line for line in warm.stdout.splitlines()
          if line.startswith("warm start | ") and model_dir in line]

  plot = subprocess.run(
      [sys.executable, os.path.join(helpers.REPO_ROOT, "scripts",
                                    "plot_metrics.py"), model_dir,
       f"--output={gcs_bucket}/plots/digits.png"],
      cwd=cwd, env=dict(os.environ, **env), capture_output=True, text=True,
      timeout=300)
  assert plot.returncode == 0, plot.stderr[-2000:]
  assert files.read_bytes(f"{gcs_bucket}/plots/digits.png")[:4] == (
      b"\x89PNG")
  assert _local_files(cwd) == []


def test_two_trainers_on_one_bucket_path_the_earlier_stops_at_its_save(
    gcs_bucket, tmp_path):
  """No lock on an object store: the second run warns, naming the first;
  the first, whose lease object was replaced, stops at its next save."""
  model_dir = f"{gcs_bucket}/runs/twice"
  # Far more steps than the first can train while the second starts (CI's
  # two busy cores once let 2,000 finish first): it ends at a save only.
  args = [*_DIGITS, "--mode=train", "--gin_param=trainer.train_steps=1000000",
          f"--model_dir={model_dir}"]
  cwd, env = _machine(tmp_path, "first")
  first = helpers.TrainProcess(args, env=env, cwd=cwd)
  second = None
  try:
    first.wait_for(r"saved checkpoint .*ckpt-20$", timeout=180)
    cwd, env = _machine(tmp_path, "second")
    second = helpers.TrainProcess(args, env=env, cwd=cwd)
    second.wait_for(r"left its trainer lease there", timeout=180)
    assert first.process.wait(timeout=180) == 1
    stderr = first.stderr
    assert stderr.strip().splitlines()[-1].startswith(
        f"train.py: error: model_dir {model_dir} was taken by pid "
        f"{second.process.pid} on host ")
  finally:
    first.close()
    if second is not None:
      second.close()


def test_the_imagenet_smoke_recipe_runs_and_resumes_from_the_bucket(
    gcs_bucket, tmp_path):
  """ResNet-50's whole recipe (fake imagenet2012 data, in the bucket):
  every artifact in the bucket, none on either machine, and a rerun
  elsewhere continues from the bucket's checkpoint."""
  # The data in the bucket too, as a cluster keeps it: tfds reads it there.
  local_data = str(tmp_path / "tfds")
  fake_data.write("imagenet2012", local_data, {"train": 16, "validation": 8},
                  image_sizes=(48, 80))
  data_dir = f"{gcs_bucket}/tfds"
  for directory, _, names in os.walk(local_data):
    for name in names:
      source = os.path.join(directory, name)
      target = f"{data_dir}/{os.path.relpath(source, local_data)}"
      tf.io.gfile.makedirs(os.path.dirname(target))
      tf.io.gfile.copy(source, target)
  model_dir = f"{gcs_bucket}/runs/r50"
  args = [f"--gin_file={_GIN}/experiments/imagenet_resnet50_cpu_smoke.gin",
          f"--gin_param=ImageNetResNet50.data_dir='{data_dir}'",
          f"--model_dir={model_dir}"]
  cwd, env = _machine(tmp_path, "first")
  first = helpers.run_cli(args, cwd=cwd, env=env, timeout=600)
  assert first.returncode == 0, first.stderr[-2000:]
  assert helpers.checkpoint_step(model_dir) == 4
  cwd, env = _machine(tmp_path, "second")
  more = helpers.run_cli([*args, "--gin_param=trainer.train_steps=6"],
                         cwd=cwd, env=env, timeout=600)
  assert more.returncode == 0, more.stderr[-2000:]
  assert f"restored checkpoint {model_dir}/ckpt-4 at step 4" in (
      more.stdout.splitlines())
  assert helpers.checkpoint_step(model_dir) == 6
  stored = _bucket_files(model_dir)
  assert {"operative_config.gin", "metrics.csv", "checkpoint"} <= set(stored)
  assert [name for name in stored if name.startswith("train/events.")]
  assert _local_files(cwd) == [] and _local_files(
      str(tmp_path / "first" / "cwd")) == []


_SWEEP = [
    "--gin_file=gin/digits.gin", "--poll_seconds=0.2",
    "--space=optimizer.learning_rate=[0.01, 0.001]", "--sampler=grid",
    "--n_trials=2", "--metric=accuracy",
    *(f"--gin_param=trainer.{name}={value}" for name, value in (
        ("train_steps", 200), ("steps_per_loop", 10),
        ("checkpoint_interval", 50), ("validation_interval", 100),
        ("summary_interval", 50)))]


def _sweep_machine(tmp_path, name):
  cwd, env = _machine(tmp_path, name)
  # Where the sweep keeps its journal and locks: this machine's own.
  env["XDG_CACHE_HOME"] = os.path.join(env["HOME"], ".cache")
  return cwd, dict(os.environ, PYTHONUNBUFFERED="1", **env)


def test_a_sweep_killed_on_one_machine_is_finished_on_another(gcs_bucket,
                                                              tmp_path):
  """`sweep.py --sweep_dir=gs://...` killed (SIGKILL, its machine lost) in
  its first trial; rerun from another empty machine, it resumes that trial
  from the bucket's checkpoint and journal and runs the next; results,
  journal and every trial's files are in the bucket, none on a machine."""
  sweep_dir = f"{gcs_bucket}/sweep"
  sweep = [sys.executable, os.path.join(helpers.REPO_ROOT, "scripts",
                                        "sweep.py"),
           *_SWEEP, f"--sweep_dir={sweep_dir}"]
  cwd, env = _sweep_machine(tmp_path, "first")
  first = subprocess.Popen(sweep, cwd=cwd, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
  try:
    deadline = time.time() + 300
    while not tf.io.gfile.exists(f"{sweep_dir}/trial-0/checkpoint"):
      assert time.time() < deadline and first.poll() is None
      time.sleep(0.5)
  finally:
    first.kill()
    out, _ = first.communicate(timeout=120)
  assert "sweep | trial 0 start | " in out, out[-3000:]
  assert _local_files(cwd) == []

  cwd, env = _sweep_machine(tmp_path, "second")
  second = subprocess.run(sweep, cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900)
  assert second.returncode == 0, (second.stdout + second.stderr)[-3000:]
  assert "sweep | trial 0 resume | " in second.stdout
  assert "sweep | trial 1 start | " in second.stdout
  assert _local_files(cwd) == []
  rows = list(csv.DictReader(io.StringIO(
      files.read_text(f"{sweep_dir}/results.csv"))))
  assert sorted((row["trial"], row["state"]) for row in rows) == [
      ("0", "COMPLETE"), ("1", "COMPLETE")]
  for row in rows:
    model_dir = f"{sweep_dir}/trial-{row['trial']}"
    assert row["model_dir"] == model_dir
    assert helpers.checkpoint_step(model_dir) == 200
    # The value the sweep reports is the run's own last evaluation.
    final = max(helpers.read_scalars(f"{model_dir}/eval")["accuracy"])[1]
    assert float(row["accuracy"]) == pytest.approx(final, abs=1e-6)
  log = files.read_text(f"{sweep_dir}/trial-0/sweep.log")
  assert re.search(r"resuming from ckpt-[1-9]\d*, step [1-9]", log), log
  assert log.count("finished at step 200") == 1
  stored = _bucket_files(sweep_dir)
  assert {"study.journal", "results.csv", "results.png"} <= set(stored)
  assert not [name for name in stored if files.TEMPORARY_PREFIX in name]
