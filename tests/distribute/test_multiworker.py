"""MultiWorkerMirroredStrategy with two real worker processes on 127.0.0.1.

Each worker is `python train.py` with `runtime.worker_hosts` and its
`runtime.task_index`; the framework writes TF_CONFIG. Every process runs under
a timeout and is killed at the end of its test.
"""

import os
import re
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf

import helpers
from trainer.storage import worker_inputs

TIMEOUT = 240


def _start_workers(model_dir, *extra, gin_file="gin/digits.gin"):
  hosts = ",".join(f"127.0.0.1:{port}" for port in helpers.free_ports(2))
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  env.pop("TF_CONFIG", None)
  workers = []
  for index in range(2):
    args = [sys.executable, helpers.TRAIN_PY, f"--gin_file={gin_file}",
            '--gin_param=runtime.distribution_strategy="multi_worker_mirrored"',
            f'--gin_param=runtime.worker_hosts="{hosts}"',
            f"--gin_param=runtime.task_index={index}",
            f"--model_dir={model_dir}", *extra]
    workers.append(subprocess.Popen(
        args, cwd=helpers.REPO_ROOT, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True))
  return workers


def _wait_for_file(path, workers):
  """Waits until `path` exists while every worker keeps running."""
  deadline = time.time() + TIMEOUT
  while not path.exists():
    assert time.time() < deadline, f"{path.name} not written in time"
    assert all(w.poll() is None for w in workers)
    time.sleep(0.2)


def _fingerprint(stdout):
  return re.search(r"weights fingerprint (\w+)", stdout).group(1)


@pytest.mark.slow  # Two train.py processes of 300 steps: 13 s.
def test_two_workers_train_digits_in_sync(tmp_path):
  model_dir = tmp_path / "run"
  outputs = helpers.finish(_start_workers(
      model_dir, "--gin_param=trainer.train_steps=300",
      '--gin_param=runtime.all_reduce_alg="ring"'))
  for returncode, stdout, stderr in outputs:
    assert returncode == 0, stderr[-3000:]
  (_, chief, _), (_, other, _) = outputs

  # Identical weights on both workers, bit for bit.
  assert _fingerprint(chief) == _fingerprint(other)
  # Each worker read its own input pipeline (digits shards by it).
  assert "input | worker 0 reads input pipeline 0 of 2" in chief
  assert "input | worker 1 reads input pipeline 1 of 2" in other
  # The chief's evaluation reaches the bar.
  evals = helpers.read_scalars(str(model_dir / "eval"))
  assert evals["accuracy"][-1] == (300, pytest.approx(
      evals["accuracy"][-1][1])) and evals["accuracy"][-1][1] >= 0.95
  # One checkpoint series and one set of event files, all the chief's.
  assert sorted(os.listdir(model_dir)) == [
      "checkpoint", "ckpt-300.data-00000-of-00001", "ckpt-300.index", "eval",
      "input", "metrics.csv", "operative_config.gin", "train"]
  # Beside it, each worker's own input position of that step.
  for index in range(2):
    assert os.listdir(model_dir / "input" / "workers-2" / f"worker-{index}"
                      ) and worker_inputs.saved_steps(str(
                          model_dir / "input" / "workers-2" /
                          f"worker-{index}")) == [300]
  # metrics.csv is the chief's alone: one row a summary, none twice.
  rows = (model_dir / "metrics.csv").read_text().splitlines()[1:]
  step_and_split = [(row.split(",")[0], row.split(",")[2]) for row in rows]
  assert rows and len(set(step_and_split)) == len(step_and_split)
  assert len(os.listdir(model_dir / "train")) == 1
  eval_files = sorted(os.listdir(model_dir / "eval"))
  assert len(eval_files) == 2 and eval_files[0] == "evaluated.json"
  # The other worker saved into a temporary directory, since removed.
  other_dir = re.search(r"saved checkpoint (\S+)/ckpt-300", other).group(1)
  assert other_dir != str(model_dir) and not os.path.exists(other_dir)


@pytest.mark.slow
def test_two_workers_train_a_mixture_and_evaluate_named_sets(tmp_path):
  model_dir = tmp_path / "run"
  outputs = helpers.finish(_start_workers(
      model_dir, "--gin_param=trainer.train_steps=200",
      "--gin_param=trainer.validation_interval=100",
      gin_file="gin/digits_mixture.gin"))
  for returncode, stdout, stderr in outputs:
    assert returncode == 0, stderr[-3000:]
  (_, chief, _), (_, other, _) = outputs
  assert _fingerprint(chief) == _fingerprint(other)
  # Each worker draws its own pipeline's mixture at the same rates.
  for stdout in (chief, other):
    assert ("mixture | clean 0.7, perturbed 0.3 (from `trainer.mixture`; a "
            "source that runs out starts over)") in stdout
  # The chief evaluates every set, each in its own TensorBoard run, and
  # keeps the best by the perturbed set.
  for name in ("clean", "perturbed", "test"):
    evals = helpers.read_scalars(str(model_dir / "eval" / name))
    assert [step for step, _ in evals["accuracy"]] == [100, 200]
  assert "best | step " in chief and "perturbed/accuracy" in chief
  shares = helpers.read_scalars(str(model_dir / "train"))
  assert shares["mixture/clean"] and shares["mixture/perturbed/loss"]


@pytest.mark.slow
def test_two_workers_train_several_models_in_sync(tmp_path):
  # The conditional GAN: three models and optimizers, each update summed
  # over both workers' replicas by `trainer.minimize`.
  model_dir = tmp_path / "run"
  outputs = helpers.finish(_start_workers(
      model_dir, "--gin_param=trainer.train_steps=200",
      "--gin_param=trainer.validation_interval=0", "--mode=train",
      gin_file="gin/digits_gan.gin"))
  for returncode, stdout, stderr in outputs:
    assert returncode == 0, stderr[-3000:]
  (_, chief, _), (_, other, _) = outputs
  assert _fingerprint(chief) == _fingerprint(other)
  assert "2 replicas" in chief, chief
  names = tf.train.load_checkpoint(str(model_dir)).get_variable_to_shape_map()
  assert {name.split("/")[1] for name in names
          if name.startswith("optimizer/")} == {
              "generator", "discriminator", "classifier"}


# Not `serial`: SIGKILL has no grace period to time; the other worker fails
# at once (its 60 s limit is generous), and the pair's ports are its own.
@pytest.mark.slow
def test_killed_worker_stops_the_other_and_both_resume(tmp_path):
  model_dir = tmp_path / "run"
  workers = _start_workers(model_dir, "--gin_param=trainer.train_steps=100000",
                           "--gin_param=runtime.seed=0",
                           "--gin_param=trainer.checkpoint_interval=100",
                           "--mode=train")
  try:
    _wait_for_file(model_dir / "ckpt-100.index", workers)
    workers[1].send_signal(signal.SIGKILL)
    killed_at = time.time()
    returncode, _, stderr = helpers.finish(workers[:1], timeout=60)[0]
    assert time.time() - killed_at < 60
  finally:
    helpers.finish(workers, timeout=10)
  assert returncode == 1
  last_line = stderr.strip().splitlines()[-1]
  assert last_line.startswith("train.py: error: ") and "Error" in last_line

  saved = int(open(model_dir / "checkpoint").read().split('"')[1]
              .rsplit("-", 1)[1])
  assert saved >= 100
  outputs = helpers.finish(_start_workers(
      model_dir, f"--gin_param=trainer.train_steps={saved + 200}",
      "--gin_param=runtime.seed=0", "--mode=train"))
  for index, (returncode, stdout, stderr) in enumerate(outputs):
    assert returncode == 0, stderr[-3000:]
    assert f"at step {saved}" in stdout  # Restored the chief's checkpoint.
    # Each worker's own position of that step: no batch read again.
    assert (f"input | resuming: worker {index} continues from its position "
            f"of step {saved} ") in stdout
    assert "skips the" not in stdout
  assert _fingerprint(outputs[0][1]) == _fingerprint(outputs[1][1])
  assert helpers.checkpoint_step(str(model_dir)) == saved + 200

  # Each worker continued its shard where it was, so the resumed run ends
  # bit-identical to one that was never interrupted.
  straight = helpers.finish(_start_workers(
      tmp_path / "straight", f"--gin_param=trainer.train_steps={saved + 200}",
      "--gin_param=runtime.seed=0", "--mode=train"))
  assert straight[0][0] == 0, straight[0][2][-3000:]
  assert _fingerprint(straight[0][1]) == _fingerprint(outputs[0][1])


@pytest.mark.slow
@pytest.mark.serial  # Signals one worker of a pair.
def test_sigterm_to_one_worker_stops_both_at_the_same_step(tmp_path):
  model_dir = tmp_path / "run"
  workers = _start_workers(model_dir, "--gin_param=trainer.train_steps=100000",
                           "--gin_param=trainer.steps_per_loop=10",
                           "--gin_param=trainer.summary_interval=10",
                           "--gin_param=trainer.checkpoint_interval=100000",
                           "--mode=train")
  try:
    _wait_for_file(model_dir / "operative_config.gin", workers)
    workers[1].send_signal(signal.SIGTERM)  # Only the non-chief.
    outputs = helpers.finish(workers, timeout=60)
  finally:
    helpers.finish(workers, timeout=10)
  steps = []
  for returncode, _, stderr in outputs:
    assert returncode == 42, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    steps.append(int(re.search(r"preempted at step (\d+):", last).group(1)))
  assert steps[0] == steps[1]  # They agreed on the step.
  assert helpers.checkpoint_step(str(model_dir)) == steps[0]


# Not `serial`: nothing is timed against a grace period; every process has
# its own timeout.
@pytest.mark.slow
def test_a_worker_whose_chief_is_refused_says_so_and_blames_no_checkpoint(
    tmp_path):
  """The chief of a rerun is refused (a stale trainer still holds the
  model_dir's lease): the other worker, restoring, names the lost peers in
  one line instead of trying every older checkpoint."""
  model_dir = tmp_path / "run"
  first = helpers.finish(_start_workers(
      model_dir, "--gin_param=trainer.train_steps=200",
      "--gin_param=trainer.checkpoint_interval=100", "--mode=train"))
  assert all(returncode == 0 for returncode, _, _ in first), first[0][2][-3000:]
  stale = helpers.TrainProcess(
      ["--gin_file=gin/digits.gin", f"--model_dir={model_dir}",
       "--gin_param=trainer.train_steps=1000000", "--mode=train"])
  try:
    stale.wait_for(r"^restored checkpoint ")
    os.kill(stale.process.pid, signal.SIGSTOP)  # Holds the lease, silent.
    (chief_code, _, chief_err), (code, _, stderr) = helpers.finish(
        _start_workers(model_dir, "--gin_param=trainer.train_steps=400",
                       "--mode=train"), timeout=180)
  finally:
    if stale.process.poll() is None:
      os.kill(stale.process.pid, signal.SIGCONT)
    stale.close()
  assert chief_code == 2, chief_err[-3000:]
  assert "is in use by" in chief_err.strip().splitlines()[-1], chief_err
  assert code == 1, stderr[-3000:]
  last = stderr.strip().splitlines()[-1]
  assert last.startswith(
      "train.py: error: the other workers of this cluster are gone while "
      f"restoring {model_dir}/ckpt-200 ("), stderr[-3000:]
  assert "no checkpoint in" not in stderr and "ckpt-100" not in last
