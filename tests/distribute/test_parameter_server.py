"""Parameter-server training with real processes on 127.0.0.1: a chief that
schedules steps, 2 workers, 1 parameter server and a sidecar evaluator, each
`python train.py` with its own TF_CONFIG task, bounded in time and killed
at the end."""

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
import tensorflow as tf

import helpers

TIMEOUT = 240


@pytest.mark.slow
@pytest.mark.parametrize("gin_file, sets", [
    ("gin/digits.gin", [None]),
    # Several datasets: a mixture on the workers, three named sets on the
    # evaluator.
    ("gin/digits_mixture.gin", ["clean", "perturbed", "test"]),
], ids=["digits", "mixture"])
def test_chief_workers_ps_and_evaluator_train_digits(tmp_path, gin_file,
                                                     sets):
  ports = [f"127.0.0.1:{port}" for port in helpers.free_ports(4)]
  cluster = {"chief": ports[:1], "worker": ports[1:3], "ps": ports[3:]}
  model_dir = tmp_path / "run"

  def launch(task_type, index, mode):
    env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CONFIG=json.dumps(
        {"cluster": cluster, "task": {"type": task_type, "index": index}}))
    return subprocess.Popen(
        [sys.executable, helpers.TRAIN_PY, f"--gin_file={gin_file}",
         "--gin_file=gin/runtime/parameter_server.gin",
         "--gin_param=trainer.train_steps=400",
         "--gin_param=trainer.checkpoint_interval=200",
         "--gin_param=trainer.continuous_eval_timeout=60",
         f"--model_dir={model_dir}", f"--mode={mode}"],
        cwd=helpers.REPO_ROOT, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)

  servers = [launch("ps", 0, "train"), launch("worker", 0, "train"),
             launch("worker", 1, "train")]
  evaluator = launch("evaluator", 0, "continuous_eval")
  chief = launch("chief", 0, "train")
  try:
    chief_out = chief.communicate(timeout=TIMEOUT)[0]
    evaluator_out = evaluator.communicate(timeout=TIMEOUT)[0]
  finally:
    for process in servers + [evaluator, chief]:
      process.kill()
    server_outs = [process.communicate()[0] for process in servers]

  assert chief.returncode == 0, chief_out[-3000:]
  assert "coordinator schedules steps on 2 worker(s); variables on 1 ps" in (
      chief_out)
  assert "input | worker i of 2 reads examples i, i + 2, ..." in chief_out
  for out, (task_type, index) in zip(server_outs, [("ps", 0), ("worker", 0),
                                                   ("worker", 1)]):
    assert f"server | {task_type} {index} serving at" in out
  assert helpers.checkpoint_step(str(model_dir)) == 400

  assert evaluator.returncode == 0, evaluator_out[-3000:]
  for name in sets:
    evals = helpers.read_scalars(str(
        model_dir / "eval" / (name or "")))
    steps = [step for step, _ in evals["accuracy"]]
    assert steps[-1] == 400, evaluator_out[-3000:]
    if name is None:
      assert evals["accuracy"][-1][1] >= 0.95
    elif name == "clean":  # 400 steps, 30% of them on perturbed images.
      assert evals["accuracy"][-1][1] >= 0.9
  if sets != [None]:
    assert "mixture | clean 0.7, perturbed 0.3" in chief_out
    shares = helpers.read_scalars(str(model_dir / "train"))
    clean = [value for _, value in shares["mixture/clean"]]
    assert abs(sum(clean) / len(clean) - 0.7) < 0.05, clean


def test_roles_run_the_modes_they_can(tmp_path, monkeypatch):
  import pytest  # pylint: disable=g-import-not-at-top
  import trainer  # pylint: disable=g-import-not-at-top
  from trainer import experiment  # pylint: disable=g-import-not-at-top
  cluster = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"],
             "ps": ["127.0.0.1:3"]}
  runtime = trainer.RuntimeConfig(distribution_strategy="parameter_server")
  for role, mode, message in [
      ("chief", "train_and_eval", "the chief runs --mode=train"),
      ("evaluator", "train", "the evaluator task runs --mode=continuous_eval"),
  ]:
    monkeypatch.setenv("TF_CONFIG", json.dumps(
        {"cluster": cluster, "task": {"type": role, "index": 0}}))
    with pytest.raises(trainer.ConfigError, match=message):
      experiment.run(helpers.LinearRegression(), mode, str(tmp_path / role),
                     runtime)
    assert not (tmp_path / role).exists()


# Runs in its own process: a ParameterServerStrategy connects the whole
# process to the cluster, which would leak into every later test.
_PER_WORKER_SHARDS = """
import json, sys
import tensorflow as tf
from trainer.data import inputs
ports = json.loads(sys.argv[1])
spec = tf.train.ClusterSpec({"worker": ports[:2], "ps": ports[2:]})
config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=3)
for index in range(2):
  tf.distribute.Server(spec, "worker", index, config=config, start=True)
tf.distribute.Server(spec, "ps", 0, start=True)
resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
    spec, rpc_layer="grpc")
strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
train_input = inputs.DistributedInput(
    strategy, lambda context: tf.data.Dataset.range(40), 2, training=True)
iterator = iter(coordinator.create_per_worker_dataset(
    train_input.per_worker_dataset_fn(2)))
step = tf.function(lambda iterator: next(iterator))
batches = [coordinator.schedule(step, args=(iterator,)) for _ in range(16)]
coordinator.join()
print(json.dumps([batch.fetch().tolist() for batch in batches]))
"""


def test_each_worker_reads_its_own_shard():
  ports = [f"127.0.0.1:{port}" for port in helpers.free_ports(3)]
  result = subprocess.run(
      [sys.executable, "-c", _PER_WORKER_SHARDS, json.dumps(ports)],
      cwd=helpers.REPO_ROOT, capture_output=True, text=True, timeout=120,
      env=dict(os.environ, TF_USE_LEGACY_KERAS="1"))
  assert result.returncode == 0, result.stderr[-3000:]
  batches = json.loads(result.stdout.strip().splitlines()[-1])
  # Worker i keeps examples i, i + 2, ...: every batch is all even or all
  # odd, and both workers took steps.
  parities = {tuple(x % 2 for x in batch) for batch in batches}
  assert parities == {(0, 0), (1, 1)}


@contextlib.contextmanager
def _chief_waiting_for_ps(tmp_path, wait_timeout):
  """Starts the chief of a cluster whose worker answers (a socket listens at
  its address) and whose ps never starts, and waits for its first waiting
  line; yields the chief, the ps port and the seconds from its `cluster |
  TF_CONFIG` line to that one. The chief is killed at the end if alive."""
  chief_port, worker_port, ps_port = helpers.free_ports(3)
  cluster = {"chief": [f"127.0.0.1:{chief_port}"],
             "worker": [f"127.0.0.1:{worker_port}"],
             "ps": [f"127.0.0.1:{ps_port}"]}
  with socket.socket() as worker:  # Answers as a worker's server does.
    worker.bind(("127.0.0.1", worker_port))
    worker.listen()
    chief = helpers.TrainProcess(
        ["--gin_file=gin/digits.gin",
         "--gin_file=gin/runtime/parameter_server.gin",
         f"--gin_param=runtime.cluster_wait_timeout={wait_timeout}",
         "--mode=train", f"--model_dir={tmp_path / 'run'}"],
        env={"TF_CONFIG": json.dumps(
            {"cluster": cluster, "task": {"type": "chief", "index": 0}})})
    try:
      chief.wait_for(r"^cluster \| TF_CONFIG: ", timeout=60)
      configured = time.time()
      chief.wait_for(
          rf"^cluster \| waiting for ps 0 at 127\.0\.0\.1:{ps_port} "
          r"\(Connection refused\) to answer \([34] s; the chief gives up "
          rf"after {wait_timeout} s, `runtime\.cluster_wait_timeout`\)$",
          timeout=wait_timeout + 10)
      yield chief, ps_port, time.time() - configured
    finally:
      chief.close()


@pytest.mark.slow  # 10 s; its sibling below keeps the wait in the default
@pytest.mark.serial  # suite. It times `runtime.cluster_wait_timeout`.
def test_a_chief_whose_ps_never_answers_says_so_and_gives_up(tmp_path):
  with _chief_waiting_for_ps(tmp_path, 6) as (chief, ps_port, unused_said):
    started = time.time()
    assert chief.finish(timeout=30) == 1, chief.stderr[-3000:]
  waited = time.time() - started
  # The rest of the 6 s after the first line (3 s into the wait).
  assert 1 <= waited < 6, waited
  assert chief.stderr.splitlines()[-1] == (
      f"train.py: error: ps 0 at 127.0.0.1:{ps_port} (Connection refused) "
      "did not answer within 6 s (`runtime.cluster_wait_timeout`): start it "
      "with its command, or correct its address in TF_CONFIG; nothing was "
      "trained or written")
  assert not (tmp_path / "run").exists()


def test_a_waiting_chief_says_so_at_once_and_exits_on_sigterm(tmp_path):
  # The wait is said while the chief waits, not with the final error after
  # `runtime.cluster_wait_timeout` (300 s by default; 120 s here, which the
  # test never reaches).
  with _chief_waiting_for_ps(tmp_path, 120) as (chief, unused_port, said):
    # 3 s into the wait (FIRST_REPORT_SECONDS), as the chief connects.
    assert 2.5 <= said < 20, said
    chief.process.send_signal(signal.SIGTERM)
    signalled = time.time()
    assert chief.finish(timeout=30) == 42, chief.stderr[-3000:]
  assert time.time() - signalled < 10
  assert chief.stderr.splitlines()[-1] == (
      "train.py: error: preempted by SIGTERM before training started: "
      "nothing to save; run the same command again (exit code 42)")
  # Said once (the next comes 30 s later), and nothing else was printed.
  assert chief.lines[0] == ("cluster | TF_CONFIG: 1 chief, 1 worker, 1 ps on "
                            "127.0.0.1, this is chief 0")
  assert len(chief.lines) == 2, chief.lines
  assert not (tmp_path / "run").exists()


class _Job:
  """A parameter-server job's processes (`python train.py`, each with its
  TF_CONFIG task) run from `directory`, their output in files there."""

  def __init__(self, directory, gin_files, num_ps):
    ports = [f"127.0.0.1:{port}" for port in helpers.free_ports(2 + num_ps)]
    self.cluster = {"chief": ports[:1], "worker": ports[1:2],
                    "ps": ports[2:]}
    self.directory = directory
    self.gin_files = gin_files
    self.processes = []

  def launch(self, task_type, index, train_steps):
    env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CONFIG=json.dumps(
        {"cluster": self.cluster, "task": {"type": task_type,
                                           "index": index}}))
    out = self.directory / f"{task_type}{index}-{len(self.processes)}.log"
    process = subprocess.Popen(
        [sys.executable, helpers.TRAIN_PY, "--model_dir=run", "--mode=train",
         *[f"--gin_file={name}" for name in self.gin_files],
         f"--gin_param=trainer.train_steps={train_steps}",
         "--gin_param=trainer.checkpoint_interval=100",
         "--gin_param=trainer.validation_interval=0"],
        cwd=str(self.directory), env=env, stdout=out.open("w"),
        stderr=subprocess.STDOUT)
    process.out = out
    self.processes.append(process)
    return process

  def servers(self):
    return [self.launch("ps", index, 100000)
            for index in range(len(self.cluster["ps"]))] + [
                self.launch("worker", 0, 100000)]

  def close(self):
    for process in self.processes:
      process.kill()
      process.wait()


@pytest.mark.slow
@pytest.mark.parametrize("gin_files, num_ps", [
    (["gin/digits.gin", "gin/runtime/parameter_server.gin"], 1),
    (["gin/recommendation.gin", "gin/runtime/parameter_server_sharded.gin"],
     2)], ids=["digits", "sharded"])
def test_a_lost_ps_is_named_and_the_chief_resumes_after_its_restart(
    tmp_path, gin_files, num_ps):
  job = _Job(tmp_path, gin_files, num_ps)
  try:
    servers = job.servers()
    chief = job.launch("chief", 0, 100000)
    deadline = time.time() + TIMEOUT
    while helpers.latest_step(str(tmp_path / "run")) < 200:
      assert time.time() < deadline and chief.poll() is None, (
          chief.out.read_text()[-3000:])
      time.sleep(0.5)
    servers[0].kill()  # ps 0.
    assert chief.wait(timeout=60) == 1, chief.out.read_text()[-3000:]
    lines = chief.out.read_text().strip().splitlines()
    last = lines[-1]
    # The coordinator's reports of the failed steps, a line each, once.
    reports = [line for line in lines if line.startswith("ERROR:tensorflow")]
    assert len(reports) == len(set(reports)) <= 5, lines[-60:]
    # gRPC's reason, where it gives one: Connection refused, mostly.
    assert re.fullmatch(
        rf"train\.py: error: ps 0 at {job.cluster['ps'][0]} is unreachable"
        r"( \([^()]+\))?: the variables it held are lost; the checkpoints "
        r"saved before stay: restart it, then run the chief's command again "
        r"to resume from the newest", last), last
    newest = helpers.checkpoint_step(str(tmp_path / "run"))
    assert newest >= 200

    # The launcher restarts the job: every task, with the same command.
    job.close()
    job.servers()
    chief = job.launch("chief", 0, newest + 100)
    assert chief.wait(timeout=TIMEOUT) == 0, chief.out.read_text()[-3000:]
  finally:
    job.close()
  out = chief.out.read_text()
  assert f"restored checkpoint run/ckpt-{newest} at step {newest}" in out
  assert helpers.checkpoint_step(str(tmp_path / "run")) == newest + 100


_LOST_PS_LINE = (
    r"train\.py: error: ps 0 at {} is unreachable( \([^()]+\))?: the "
    r"variables it held are lost; the checkpoints saved before stay: restart "
    r"it, then run the chief's command again to resume from the newest")


@pytest.mark.slow
@pytest.mark.serial  # Kills a ps between loops.
def test_a_ps_lost_between_loops_is_named(tmp_path):
  # Killed as the chief prints a loop's progress line: it then reads the
  # loop's metrics and saves, both from the ps, before the next loop.
  job = _Job(tmp_path, ["gin/digits.gin", "gin/runtime/parameter_server.gin"],
             1)
  try:
    servers = job.servers()
    chief = job.launch("chief", 0, 100000)
    deadline = time.time() + TIMEOUT
    while not re.search(r"^train \| step +200/", chief.out.read_text(),
                        re.MULTILINE):
      assert time.time() < deadline and chief.poll() is None, (
          chief.out.read_text()[-3000:])
      time.sleep(0.02)
    servers[0].kill()  # ps 0.
    assert chief.wait(timeout=60) == 1, chief.out.read_text()[-3000:]
  finally:
    job.close()
  last = chief.out.read_text().strip().splitlines()[-1]
  assert re.fullmatch(_LOST_PS_LINE.format(job.cluster["ps"][0]), last), last
  assert helpers.checkpoint_step(str(tmp_path / "run")) >= 100


@pytest.mark.slow
def test_several_models_train_on_parameter_servers(tmp_path):
  # The conditional GAN: three models, three optimizers, their variables
  # and slots on the ps, steps on the worker.
  job = _Job(tmp_path, ["gin/digits_gan.gin",
                        "gin/runtime/parameter_server.gin"], 1)
  try:
    job.servers()
    chief = job.launch("chief", 0, 200)
    assert chief.wait(timeout=TIMEOUT) == 0, chief.out.read_text()[-3000:]
  finally:
    job.close()
  out = chief.out.read_text()
  assert out.count("placement | /job:ps/task:0/device:CPU:0: ") == 3, out
  # Nothing but the run's own lines: AutoGraph no longer converts the
  # per-worker dataset function (it warned about scikit-learn's code).
  assert "WARNING" not in out, out
  assert helpers.checkpoint_step(str(tmp_path / "run")) == 200
  names = tf.train.load_checkpoint(str(tmp_path / "run")
                                   ).get_variable_to_shape_map()
  assert {name.split("/")[1] for name in names
          if name.startswith("optimizer/")} == {
              "generator", "discriminator", "classifier"}
  scalars = helpers.read_scalars(str(tmp_path / "run" / "train"))
  assert scalars["learning_rate/classifier"][-1][1] == pytest.approx(1e-3)
  assert scalars["learning_rate/generator"][-1][1] == pytest.approx(2e-4)
