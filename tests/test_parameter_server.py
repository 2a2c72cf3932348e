"""Parameter-server training with real processes on 127.0.0.1: a chief that
schedules steps, 2 workers, 1 parameter server and a sidecar evaluator, each
`python train.py` with its own TF_CONFIG task, bounded in time and killed
at the end."""

import json
import os
import subprocess
import sys

import pytest

import helpers

TIMEOUT = 240


def test_chief_workers_ps_and_evaluator_train_digits(tmp_path):
  ports = [f"127.0.0.1:{port}" for port in helpers.free_ports(4)]
  cluster = {"chief": ports[:1], "worker": ports[1:3], "ps": ports[3:]}
  model_dir = tmp_path / "run"

  def launch(task_type, index, mode):
    env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CONFIG=json.dumps(
        {"cluster": cluster, "task": {"type": task_type, "index": index}}))
    return subprocess.Popen(
        [sys.executable, helpers.TRAIN_PY, "--gin_file=gin/digits.gin",
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
  evals = helpers.read_scalars(str(model_dir / "eval"))
  steps = [step for step, _ in evals["accuracy"]]
  assert steps[-1] == 400, evaluator_out[-3000:]
  assert evals["accuracy"][-1][1] >= 0.95


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
from trainer import inputs
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


def _tf_config(monkeypatch, task_type):
  monkeypatch.setenv("TF_CONFIG", json.dumps({
      "cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"],
                  "ps": ["127.0.0.1:3"]},
      "task": {"type": task_type, "index": 0}}))


def test_each_role_runs_its_own_mode(monkeypatch):
  from trainer import errors
  from trainer import parameter_server
  from trainer import runtime as runtime_lib
  import trainer

  runtime = runtime_lib.RuntimeConfig(distribution_strategy="parameter_server")
  config = trainer.TrainerConfig()
  _tf_config(monkeypatch, "evaluator")
  evaluated, mode = parameter_server.role_runtime(runtime, "continuous_eval",
                                                 config)
  assert evaluated.distribution_strategy == "default"
  assert mode == "continuous_eval"
  with pytest.raises(errors.ConfigError, match="^the evaluator task runs "):
    parameter_server.role_runtime(runtime, "train", config)
  _tf_config(monkeypatch, "chief")
  assert parameter_server.role_runtime(runtime, "train", config) == (
      runtime, "train")
  with pytest.raises(errors.ConfigError, match="the chief runs --mode=train"):
    parameter_server.role_runtime(runtime, "train_and_eval", config)
  with pytest.raises(errors.ConfigError, match="'rollback'` is not supported"):
    parameter_server.role_runtime(
        runtime, "train", trainer.TrainerConfig(on_nonfinite="rollback"))
