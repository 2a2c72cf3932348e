"""Sharded variables on parameter servers: `runtime.variable_partitioner`,
the shipped recommendation task's embedding table split over 2 ps tasks of
a real cluster of processes on 127.0.0.1, its placement read back, and its
checkpoints moving between the sharded and the one-device model."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import helpers
import trainer
from tasks import recommendation
from trainer.distribute import parameter_server
from trainer.distribute import strategy as strategy_lib

TIMEOUT = 300
TABLE = "model/layer_with_weights-0/embeddings/.ATTRIBUTES/VARIABLE_VALUE"


@pytest.mark.parametrize("name, args, message", [
    ("min_size", None, None),
    ("fixed_shards", {"num_shards": 2}, None),
    ("max_size", {"max_shard_bytes": 1 << 20, "max_shards": None}, None),
    ("max_size", None, "`runtime.variable_partitioner` 'max_size' needs "
     "`runtime.variable_partitioner_args` with max_shard_bytes."),
    ("fixed", None, "`runtime.variable_partitioner` ('fixed') must be None "
     "or one of: min_size, max_size, fixed_shards."),
    ("fixed_shards", {"shards": 2}, "`runtime.variable_partitioner_args` "
     "has shards, which 'fixed_shards' does not take; it takes: num_shards."),
    ("fixed_shards", {"num_shards": 0}, "`runtime.variable_partitioner_args` "
     "num_shards (0) must be a positive integer."),
    ("min_size", [1], "`runtime.variable_partitioner_args` ([1]) must be a "
     "dict of keyword arguments, or None."),
])
def test_partitioner_settings_are_checked_by_building_them(name, args,
                                                           message):
  settings = dict(distribution_strategy="parameter_server",
                  variable_partitioner=name, variable_partitioner_args=args)
  if message is None:
    strategy_lib.check(trainer.RuntimeConfig(**settings))
    return
  with pytest.raises(trainer.ConfigError) as raised:
    strategy_lib.check(trainer.RuntimeConfig(**settings))
  assert str(raised.value).splitlines()[0] == message


def test_a_partitioner_needs_parameter_servers():
  with pytest.raises(trainer.ConfigError,
                     match=r"^`runtime.variable_partitioner` shards variables "
                     r"over parameter servers: it needs 'parameter_server', "
                     r"not 'mirrored'."):
    strategy_lib.check(trainer.RuntimeConfig(
        distribution_strategy="mirrored", variable_partitioner="min_size"))
  with pytest.raises(trainer.ConfigError,
                     match=r"^`runtime.variable_partitioner_args` needs "
                     r"`runtime.variable_partitioner`."):
    strategy_lib.check(
        trainer.RuntimeConfig(variable_partitioner_args={"num_shards": 2}))


def test_the_recommendation_task_learns_on_one_device(tmp_path):
  results = trainer.run(
      recommendation.HashedRecommendation(), "train_and_eval",
      str(tmp_path), trainer.RuntimeConfig(seed=0),
      trainer.TrainerConfig(
          train_steps=600, steps_per_loop=100, global_batch_size=128,
          eval_batch_size=512, checkpoint_interval=600, summary_interval=100,
          validation_interval=600, optimizer=_adam()))
  # Clicks follow the hidden tastes: far better than the 0.5 of a guess.
  assert results["auc"] > 0.8, results
  assert results["accuracy"] > 0.7, results


def _adam():
  from trainer.model import optimization  # pylint: disable=g-import-not-at-top
  return optimization.OptimizerConfig(name="adam", learning_rate=0.01)


class _Cluster:
  """2 ps and 2 worker processes serving until closed."""

  def __init__(self, ports):
    self.spec = {"chief": ports[:1], "worker": ports[1:3], "ps": ports[3:5]}
    self.servers = [self.launch(task_type, index, "train")
                    for task_type, index in (("ps", 0), ("ps", 1),
                                             ("worker", 0), ("worker", 1))]

  def launch(self, task_type, index, mode, *params):
    env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CONFIG=json.dumps(
        {"cluster": self.spec, "task": {"type": task_type, "index": index}}))
    return subprocess.Popen(
        [sys.executable, helpers.TRAIN_PY, *_FLAGS, f"--mode={mode}",
         "--gin_file=gin/runtime/parameter_server_sharded.gin",
         *[f"--gin_param={param}" for param in params]],
        cwd=self.model_dir_parent, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)

  def close(self):
    for process in self.servers:
      process.kill()
      process.communicate()


_FLAGS = ["--gin_file=gin/recommendation.gin", "--model_dir=runs/rec",
          "--gin_param=trainer.checkpoint_interval=100",
          "--gin_param=trainer.validation_interval=0"]


def _fingerprint(out: str) -> str:
  found = re.search(r"weights fingerprint (\w+)", out)
  assert found, out[-3000:]
  return found.group(1)


def _one_device(cwd, *params):
  result = helpers.run_cli(
      _FLAGS + ["--gin_param=runtime.seed=0"] +
      [f"--gin_param={param}" for param in params], cwd=str(cwd),
      timeout=TIMEOUT)
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stdout


@pytest.mark.slow
def test_a_sharded_table_trains_on_two_ps_and_moves_to_one_device_and_back(
    tmp_path):
  _Cluster.model_dir_parent = str(tmp_path)
  model_dir = tmp_path / "runs" / "rec"
  cluster = _Cluster([f"127.0.0.1:{p}" for p in helpers.free_ports(5)])
  try:
    chief = cluster.launch("chief", 0, "train", "trainer.train_steps=200")
    out = chief.communicate(timeout=TIMEOUT)[0]
    assert chief.returncode == 0, out[-3000:]
    # Read back from the chief's variables: the 65,536 x 16 table (4 MiB,
    # above the 256 KiB `min_shard_bytes`) is split in 2, one shard per ps.
    shards = re.search(r"placement \| embedding/embeddings \[65536, 16\] in "
                       r"2 shards: \[32768, 16\] on /job:ps/task:(\d)/device:"
                       r"CPU:0, \[32768, 16\] on /job:ps/task:(\d)/", out)
    assert shards and sorted(shards.groups()) == ["0", "1"], out[-3000:]
    for ps in (0, 1):
      assert re.search(rf"placement \| /job:ps/task:{ps}/device:CPU:0: \d+ "
                       r"variable\(s\)", out), out[-3000:]
    sharded_200 = _fingerprint(out)
    # The checkpoint holds the table whole.
    reader = tf.train.load_checkpoint(str(model_dir))
    assert reader.get_variable_to_shape_map()[TABLE] == [65536, 16]

    # Sharded -> one device: the same weights, bit for bit.
    out = _one_device(tmp_path, "trainer.train_steps=200")
    assert "restored checkpoint runs/rec/ckpt-200 at step 200" in out
    assert "input | ckpt-200 holds no input position" in out
    assert _fingerprint(out) == sharded_200
    # Trained on, the optimizer slots restored too (Adam's would otherwise
    # start from zero and the step would differ), then saved unsharded.
    out = _one_device(tmp_path, "trainer.train_steps=300")
    one_device_300 = _fingerprint(out)
    table_300 = tf.train.load_checkpoint(str(model_dir)).get_tensor(TABLE)

    # One device -> sharded: the chief restores it into the shards.
    chief = cluster.launch("chief", 0, "train", "trainer.train_steps=300")
    out = chief.communicate(timeout=TIMEOUT)[0]
    assert chief.returncode == 0, out[-3000:]
    assert "restored checkpoint runs/rec/ckpt-300 at step 300" in out
    assert _fingerprint(out) == one_device_300
    # And trains on, sharded.
    chief = cluster.launch("chief", 0, "train", "trainer.train_steps=400")
    out = chief.communicate(timeout=TIMEOUT)[0]
    assert chief.returncode == 0, out[-3000:]
    table_400 = tf.train.load_checkpoint(str(model_dir)).get_tensor(TABLE)
    assert helpers.checkpoint_step(str(model_dir)) == 400
    assert not np.array_equal(table_300, table_400)
  finally:
    cluster.close()


def test_shard_lines_read_the_shards_of_a_sharded_variable():
  # A ShardedVariable made by hand, as the strategy makes them.
  from tensorflow.python.distribute import sharded_variable  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import
  parts = [tf.Variable(tf.zeros([3, 2]), name="table/part_0"),
           tf.Variable(tf.zeros([2, 2]), name="table/part_1")]
  table = sharded_variable.ShardedVariable(parts)
  lines = parameter_server.shard_lines(parts + [tf.Variable(1.0)])
  assert lines == ["table [5, 2] in 2 shards: [3, 2] on /device:CPU:0, "
                   "[2, 2] on /device:CPU:0"]
  del table
