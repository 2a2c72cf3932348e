"""Cluster membership: TF_CONFIG, and which worker this process is.

Multi-worker training runs on tf.distribute's own machinery; this module only
writes TF_CONFIG from `runtime.worker_hosts` + `runtime.task_index` (through
Model Garden's `distribute_utils.configure_cluster`), checks an existing
TF_CONFIG, and tells each process its input shard and whether it is the chief
(the one process that writes into `model_dir`).
"""

import dataclasses
import json
import os
import re
from typing import List, Optional, Tuple

import tensorflow as tf
from official.common import distribute_utils

from trainer import console
from trainer import errors

_HOST_PORT = re.compile(r"^[^:,\s]+:\d{1,5}$")


@dataclasses.dataclass(frozen=True)
class WorkerInfo:
  """Where this process stands among the workers.

  Attributes:
    num_workers: Processes that run training steps (chief included).
    worker_index: This process's position among them; its input shard.
    is_chief: Whether this process writes checkpoints and summaries.
  """
  num_workers: int = 1
  worker_index: int = 0
  is_chief: bool = True


def parse_worker_hosts(worker_hosts: str) -> List[str]:
  """Splits `host:port,host:port`; raises `ConfigError` on a malformed entry."""
  hosts = [host.strip() for host in worker_hosts.split(",")]
  for host in hosts:
    if not _HOST_PORT.match(host):
      raise errors.ConfigError(
          f"`runtime.worker_hosts` entry {host!r} is not `host:port`.")
  return hosts


def read_tf_config() -> Optional[dict]:
  """Returns the parsed TF_CONFIG, None if unset; checks its structure."""
  text = os.environ.get("TF_CONFIG", "").strip()
  if not text:
    return None
  try:
    config = json.loads(text)
  except json.JSONDecodeError as e:
    raise errors.ConfigError(f"TF_CONFIG is not valid JSON: {e}.") from e
  if not isinstance(config, dict) or not isinstance(
      config.get("cluster"), dict):
    raise errors.ConfigError(
        "TF_CONFIG needs a `cluster` object, e.g. "
        '{"cluster": {"worker": ["host:port", ...]}, '
        '"task": {"type": "worker", "index": 0}}.')
  task = config.get("task", {})
  task_type, index = task.get("type"), task.get("index")
  if task_type == "evaluator" and isinstance(index, int):
    return config  # The sidecar evaluator stays outside the cluster.
  members = config["cluster"].get(task_type)
  if not isinstance(members, list) or not isinstance(index, int) or not (
      0 <= index < len(members)):
    raise errors.ConfigError(
        f"TF_CONFIG task {task!r} does not name a member of its cluster "
        f"({', '.join(config['cluster'])}).")
  return config


def configure(worker_hosts: Optional[str], task_index: int) -> None:
  """Writes TF_CONFIG from `worker_hosts` + `task_index`, or checks it.

  Raises:
    errors.ConfigError: For a malformed TF_CONFIG, or both it and
      `worker_hosts` given.
  """
  existing = read_tf_config()
  if worker_hosts and existing is not None:
    raise errors.ConfigError(
        "Both TF_CONFIG and `runtime.worker_hosts` are set; use one.")
  if worker_hosts:
    distribute_utils.configure_cluster(worker_hosts, task_index)


def worker_info(strategy: tf.distribute.Strategy) -> WorkerInfo:
  """Returns this process's place among the strategy's workers."""
  resolver = getattr(strategy, "cluster_resolver", None)
  spec = resolver.cluster_spec().as_dict() if resolver is not None else {}
  chiefs, workers = spec.get("chief", []), spec.get("worker", [])
  if not isinstance(strategy,
                    tf.distribute.MultiWorkerMirroredStrategy) or not (
                        chiefs or workers):
    return WorkerInfo()
  task_type, task_id = resolver.task_type, resolver.task_id or 0
  if task_type == "chief":
    index = 0
  else:
    index = task_id + len(chiefs)
  return WorkerInfo(num_workers=len(chiefs) + len(workers),
                    worker_index=index, is_chief=index == 0)


def task_role() -> Tuple[Optional[str], int]:
  """Returns this process's `(task type, index)` in TF_CONFIG, or (None, 0)."""
  config = read_tf_config()
  if config is None or "task" not in config:
    return None, 0
  return config["task"]["type"], config["task"]["index"]


def num_tasks(task_type: str,
              spec: Optional[tf.train.ClusterSpec] = None) -> int:
  """Returns how many `task_type` tasks `spec` (else TF_CONFIG's cluster) has.

  (A `ParameterServerStrategy` keeps its resolver private; TF_CONFIG
  describes the same cluster.)
  """
  if spec is None:
    spec = tf.distribute.cluster_resolver.TFConfigClusterResolver(
    ).cluster_spec()
  return len(spec.as_dict().get(task_type, []))


def serve_forever(task_type: str, task_index: int) -> None:
  """Runs this process's `tf.distribute.Server` (a ps or worker) until killed.

  A parameter-server cluster's workers and parameter servers only serve: the
  chief schedules the steps on them. Their launcher stops them when the
  chief is done.
  """
  resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
  spec = resolver.cluster_spec()
  num_workers = num_tasks("worker", spec)
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
  server.join()
