"""Process roles in a cluster: what this process is in TF_CONFIG, and what
each role runs.

A parameter-server cluster's workers and parameter servers start a
`tf.distribute.Server` and serve until stopped (`serve_forever`); its chief
trains; a sidecar `evaluator` task (of a parameter-server or multi-worker
cluster) evaluates the chief's checkpoints on its own, with no strategy.
"""

import dataclasses
import os
import socket
import sys
import threading
import time
from typing import Optional, Tuple

import tensorflow as tf

from trainer import console
from trainer import errors
from trainer import runtime as runtime_lib
from trainer.distribute import cluster


def task_role() -> Tuple[Optional[str], int]:
  """Returns this process's `(task type, index)` in TF_CONFIG, or (None, 0)."""
  config = cluster.read_tf_config()
  if config is None or "task" not in config:
    return None, 0
  return config["task"]["type"], config["task"]["index"]


def evaluator_role(runtime: runtime_lib.RuntimeConfig, mode: str,
                   membership: cluster.Membership
                   ) -> Tuple[runtime_lib.RuntimeConfig, str]:
  """The runtime and mode of a cluster's sidecar evaluator task: it
  evaluates the chief's checkpoints on its own, with no strategy. Under
  `srun` every task shares one `--mode`: the SLURM step's evaluator task
  evaluates continuously where the others train.

  Raises:
    errors.ConfigError: If `mode` does not evaluate.
  """
  if membership.from_slurm and mode == "train":
    mode = "continuous_eval"
  if mode not in ("eval", "continuous_eval"):
    raise errors.ConfigError(
        "the evaluator task runs --mode=continuous_eval (or eval).")
  return dataclasses.replace(runtime, distribution_strategy="default",
                             num_ps=0, evaluator_task=False), mode


def role_runtime(runtime: runtime_lib.RuntimeConfig, mode: str,
                 on_nonfinite: str, membership: cluster.Membership
                 ) -> Tuple[Optional[runtime_lib.RuntimeConfig], str]:
  """Acts on this process's role in a parameter-server cluster.

  Args:
    runtime: The runtime settings.
    mode: The `--mode` this process was started with.
    on_nonfinite: `trainer.on_nonfinite`, which parameter servers limit.
    membership: How this process joined the cluster.

  Returns:
    (None, mode) after serving as a worker or ps (until stopped);
    otherwise the runtime and mode to train (chief) or evaluate
    (`evaluator_role`) with.

  Raises:
    errors.ConfigError: If the role cannot run `mode`, or for settings
      parameter servers do not support.
  """
  if on_nonfinite == "rollback":
    raise errors.ConfigError(
        "`trainer.on_nonfinite='rollback'` is not supported with "
        "'parameter_server': use 'stop' and restart.")
  role, index = task_role()
  if role in ("worker", "ps"):
    serve_forever(role, index, membership)
    return None, mode
  if role == "evaluator":
    return evaluator_role(runtime, mode, membership)
  if mode != "train":
    raise errors.ConfigError(
        "with 'parameter_server' the chief runs --mode=train; evaluation "
        "runs in an `evaluator` task (--mode=continuous_eval).")
  return runtime, mode


def serve_forever(task_type: str, task_index: int,
                  membership: cluster.Membership) -> None:
  """Runs this process's `tf.distribute.Server` (a ps or worker) until killed.

  A parameter-server cluster's workers and parameter servers only serve: the
  chief schedules the steps on them. Their launcher stops them when the
  chief is done; under SLURM (`membership.from_slurm`) they stop themselves
  once the chief is gone.
  """
  resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
  spec = resolver.cluster_spec()
  num_workers = cluster.num_tasks("worker", spec)
  config = tf.compat.v1.ConfigProto()
  # Measured here: inter-op threads equal to the core count deadlocked
  # `coordinator.join()`; one per worker plus one does not.
  config.inter_op_parallelism_threads = max(os.cpu_count() or 1,
                                            num_workers + 1)
  server = tf.distribute.Server(spec, job_name=task_type,
                                task_index=task_index,
                                protocol=resolver.rpc_layer or "grpc",
                                config=config, start=True)
  address = spec.task_address(task_type, task_index)
  console.info(f"server | {task_type} {task_index} serving at {address}")
  if membership.from_slurm:
    # A SLURM step ends when all its tasks have; nobody else stops these.
    threading.Thread(target=_stop_after_chief, name="chief-watch",
                     args=(spec.task_address("chief", 0),
                           f"{task_type} {task_index}"),
                     daemon=True).start()
  server.join()


def _stop_after_chief(chief: str, name: str, interval: float = 2.0,
                      misses: int = 3) -> None:
  """Ends this server's process once the chief, having come up, stops
  answering at `chief` `misses` times in a row."""
  host, port = chief.rsplit(":", 1)
  seen, missed = False, 0
  while True:
    try:
      socket.create_connection((host, int(port)), timeout=interval).close()
      seen, missed = True, 0
    except OSError:
      missed += seen
    if missed >= misses:
      console.info(f"server | the chief at {chief} is gone: {name} stops")
      sys.stdout.flush()
      os._exit(0)  # pylint: disable=protected-access
    time.sleep(interval)
