"""Cluster membership: where a multi-process run's cluster comes from, and
which worker this process is.

Multi-worker and parameter-server training run on tf.distribute's own
machinery, which reads the cluster from TF_CONFIG. This module sets it once
per process, from the first of: `runtime.worker_hosts` + `runtime.task_index`
(through Model Garden's `distribute_utils.configure_cluster`); a TF_CONFIG
already set (by Kubernetes operators, cloud training services, or by hand);
the SLURM step this process is a task of (`trainer.distribute.slurm`). Each
is checked against the others where they meet, and one line says where the
cluster came from. `configure` runs once, when the process is set up, and
returns a `Membership` that is passed to what needs it (no module state). The
module also tells each process its input shard and whether it is the chief
(the one process that writes into `model_dir`), and waits for a cluster's
tasks.
"""

import dataclasses
import json
import os
import re
import socket
import time
from typing import Dict, List, Optional

import tensorflow as tf
from official.common import distribute_utils

from trainer import console
from trainer import errors
from trainer import runtime as runtime_lib
from trainer.distribute import slurm

# Strategies whose processes form a cluster.
MULTI_PROCESS = ("multi_worker_mirrored", "parameter_server")

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


@dataclasses.dataclass(frozen=True)
class Membership:
  """How this process joined its cluster: `configure`'s answer, made once
  when the process is set up and passed to what needs it.

  Attributes:
    slurm_step: The SLURM step the cluster came from; None where it came
      from `runtime.worker_hosts` or TF_CONFIG, or there is no cluster.
  """
  slurm_step: Optional[slurm.Step] = None

  @property
  def from_slurm(self) -> bool:
    """Whether this process's cluster came from its SLURM step."""
    return self.slurm_step is not None


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
  if isinstance(config, dict) and "sparseCluster" in config:
    raise errors.ConfigError(
        "TF_CONFIG has a `sparseCluster` (Kubeflow's EnableDynamicWorker), "
        "which names only this task's peers: tf.distribute needs the whole "
        "`cluster`; turn dynamic workers off.")
  if not isinstance(config, dict) or not isinstance(
      config.get("cluster"), dict):
    raise errors.ConfigError(
        "TF_CONFIG needs a `cluster` object, e.g. "
        '{"cluster": {"worker": ["host:port", ...]}, '
        '"task": {"type": "worker", "index": 0}}.')
  if "master" in config["cluster"]:
    raise errors.ConfigError(
        "TF_CONFIG names a `master` task, which tf.distribute refuses "
        "(\"Disallowed task type\"): name it `chief`.")
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


def configure(runtime: runtime_lib.RuntimeConfig) -> Membership:
  """Sets TF_CONFIG for a multi-process strategy and says where the cluster
  came from: `runtime.worker_hosts`, TF_CONFIG as set, or the SLURM step.

  Call it once per process, when it is set up: it writes TF_CONFIG and says
  so (or warns that each SLURM task trains on its own).

  Returns:
    How this process joined the cluster.

  Raises:
    errors.ConfigError: For a malformed TF_CONFIG, sources that contradict
      each other (TF_CONFIG and `worker_hosts`; either and the SLURM step),
      a SLURM environment that cannot form the cluster, or a port in use.
  """
  strategy = runtime.distribution_strategy
  if strategy not in MULTI_PROCESS:
    _warn_one_process_per_task(strategy)
    return Membership()
  existing = read_tf_config()
  if runtime.worker_hosts and existing is not None:
    raise errors.ConfigError(
        "Both TF_CONFIG and `runtime.worker_hosts` are set; use one.")
  step = slurm.read_step()
  several = step is not None and step.num_tasks > 1
  membership = Membership()
  if runtime.worker_hosts:
    hosts = parse_worker_hosts(runtime.worker_hosts)
    if several:
      _check_against_step("`runtime.worker_hosts`", len(hosts),
                          max(runtime.task_index, 0), step)
    distribute_utils.configure_cluster(runtime.worker_hosts,
                                       runtime.task_index)
    origin = "runtime.worker_hosts"
  elif existing is not None:
    if several and strategy == "multi_worker_mirrored":
      _check_tf_config_against_step(existing, step)
    origin = "TF_CONFIG"
  elif step is not None:
    _from_slurm(runtime, step)
    membership = Membership(slurm_step=step)
    origin = step.describe()
  else:
    tasks = slurm.batch_tasks()
    if tasks > 1:
      raise errors.ConfigError(
          f"'{strategy}' in the batch script of SLURM job {slurm.job_id()}, "
          f"which SLURM runs once for the {tasks} tasks it asked for: start "
          "the command with srun, which runs it in every task.")
    # One process: a one-worker cluster, or the strategy's error.
    return membership
  console.info(f"cluster | {origin}: "
               f"{_describe(read_tf_config(), membership.slurm_step)}")
  return membership


def _warn_one_process_per_task(strategy: str) -> None:
  """Says that every task of a multi-task SLURM step trains on its own
  where `strategy` trains in one process (the second task's lease on
  `model_dir` then refuses it)."""
  try:
    step = slurm.read_step()
  except errors.ConfigError:
    return  # Not this strategy's business.
  if step is not None and step.num_tasks > 1:
    console.warning(
        f"{step.describe()} runs this command in {step.num_tasks} tasks, "
        f"and '{strategy}' trains in one process: each task trains on its "
        "own. For one run over all of them use 'multi_worker_mirrored'; "
        "for one run here, srun -n1.")


def _from_slurm(runtime: runtime_lib.RuntimeConfig, step: slurm.Step
                ) -> None:
  """Writes TF_CONFIG for the SLURM step's tasks.

  Raises:
    errors.ConfigError: See `configure`.
  """
  strategy = runtime.distribution_strategy
  if strategy == "multi_worker_mirrored" and step.num_tasks == 1:
    raise errors.ConfigError(
        f"'multi_worker_mirrored' in {step.describe()}, which has one task "
        "(srun -n1): there is no other worker. Start one task per worker "
        "(srun -n2, or --ntasks in the batch script), or use 'mirrored' for "
        "the devices of one machine.")
  if strategy == "parameter_server" and runtime.num_ps < 1:
    raise errors.ConfigError(
        f"'parameter_server' in {step.describe()} needs `runtime.num_ps`: "
        "how many of its tasks serve as parameter servers.")
  base = slurm.port_base(step, runtime.port_base)
  spec, task_type, index = slurm.cluster(step, strategy, base,
                                         runtime.num_ps,
                                         runtime.evaluator_task)
  if task_type != "evaluator":
    _check_port_free(base + step.local_id, base, step)
  os.environ["TF_CONFIG"] = json.dumps(
      {"cluster": spec, "task": {"type": task_type, "index": index}})


def _check_port_free(port: int, base: int, step: slurm.Step) -> None:
  """Raises if something listens on `port` here.

  gRPC servers share ports (SO_REUSEPORT): TensorFlow would start on a busy
  port without a word and another job's peers would talk to it.
  """
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      probe.bind(("", port))
    except OSError as e:
      source = ("`runtime.port_base`" if base != slurm.port_base(step, None)
                else f"the port rule for job {step.job_id}")
      raise errors.ConfigError(
          f"port {port} on {step.node} ({source} {base} + local task "
          f"{step.local_id}) is in use ({e.strerror}): set "
          "`runtime.port_base` to the start of a free range.") from e


def _check_against_step(source: str, members: int, index: int,
                        step: slurm.Step) -> None:
  """Raises if a cluster of `members` with this task at `index` is not the
  SLURM step's."""
  if members != step.num_tasks:
    raise errors.ConfigError(
        f"{source} names {members} worker(s), but {step.describe()} has "
        f"{step.num_tasks} tasks (srun -n{step.num_tasks}): leave it unset "
        "under srun and the cluster comes from SLURM.")
  if index != step.proc_id:
    raise errors.ConfigError(
        f"{source} makes this task worker {index}, but it is SLURM task "
        f"{step.proc_id} (SLURM_PROCID) of {step.describe()}: srun gives "
        "every task the same arguments and environment; leave it unset "
        "under srun and the cluster comes from SLURM.")


def _check_tf_config_against_step(config: dict, step: slurm.Step) -> None:
  """Raises if TF_CONFIG's workers are not the SLURM step's tasks."""
  spec = config["cluster"]
  members = len(spec.get("chief", [])) + len(spec.get("worker", []))
  task = config.get("task", {})
  if task.get("type") == "evaluator":
    return
  index = task.get("index", 0) + (
      len(spec.get("chief", [])) if task.get("type") == "worker" else 0)
  _check_against_step("TF_CONFIG", members, index, step)


def _describe(config: dict, step: Optional[slurm.Step]) -> str:
  """E.g. `2 workers on vm, this is worker 1`; the hosts are the SLURM
  `step`'s node list where the cluster came from it."""
  spec, task = config["cluster"], config.get("task", {})
  def plural(name: str) -> str:
    return name + ("s" if name != "ps" and len(spec[name]) > 1 else "")

  counts = ", ".join(f"{len(spec[name])} {plural(name)}"
                     for name in ("chief", "worker", "ps") if spec.get(name))
  hosts = sorted({address.rsplit(":", 1)[0]
                  for members in spec.values() for address in members})
  where = (step.nodelist if step is not None
           else ", ".join(hosts[:3]) + (", ..." if len(hosts) > 3 else ""))
  if task.get("type") == "evaluator":
    this = "this is the evaluator (outside the cluster)"
  else:
    this = f"this is {task.get('type')} {task.get('index')}"
  return f"{counts} on {where}, {this}"


def restrict_gpus(membership: Membership) -> Optional[List[int]]:
  """Makes this process use its share of its node's GPUs, where the
  cluster came from a SLURM step whose tasks share them; returns the GPUs
  kept (None: all, or none to share). Call before TensorFlow initialises
  its devices.

  Raises:
    errors.ConfigError: See `slurm.gpus_for_task`.
  """
  step = membership.slurm_step
  if step is None:
    return None
  gpus = tf.config.list_physical_devices("GPU")
  share = slurm.gpus_for_task(len(gpus), step)
  if share is not None:
    tf.config.set_visible_devices([gpus[i] for i in share], "GPU")
    console.info(f"cluster | {step.node} local task {step.local_id} uses "
                 "GPU(s) "
                 f"{', '.join(map(str, share))}")
  return share


def worker_info(strategy: tf.distribute.Strategy) -> WorkerInfo:
  """Returns this process's place among the strategy's workers."""
  resolver = getattr(strategy, "cluster_resolver", None)
  if resolver is None or not isinstance(
      strategy, tf.distribute.MultiWorkerMirroredStrategy):
    return WorkerInfo()
  return worker_position(resolver.cluster_spec().as_dict(),
                         resolver.task_type, resolver.task_id or 0)


def worker_position(spec: Dict[str, List[str]], task_type: Optional[str],
                    task_id: int) -> WorkerInfo:
  """This task's place among a synchronous cluster's workers: the chief
  (if any) first, then the workers; other task types are not workers."""
  chiefs, workers = spec.get("chief", []), spec.get("worker", [])
  if not (chiefs or workers):
    return WorkerInfo()
  index = 0 if task_type == "chief" else task_id + len(chiefs)
  return WorkerInfo(num_workers=len(chiefs) + len(workers),
                    worker_index=index, is_chief=index == 0)


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


# How often the tasks are asked, and when the waiting is said: after the
# first seconds (tasks started with the chief are still importing
# TensorFlow), then at a slow cadence.
PROBE_SECONDS = 0.5
FIRST_REPORT_SECONDS = 3.0
REPORT_SECONDS = 30.0


def probe(address: str, timeout: float = 1.0) -> Optional[str]:
  """Returns None if something listens at `address` (`host:port`: a task's
  gRPC server), else why not (`Connection refused`)."""
  host, port = address.rsplit(":", 1)
  try:
    socket.create_connection((host, int(port)), timeout=timeout).close()
  except OSError as e:
    return e.strerror or type(e).__name__
  return None


def wait_for_tasks(tasks: Dict[str, str], timeout: Optional[float],
                   probe_fn=probe, clock=time.monotonic,
                   sleep=time.sleep) -> None:
  """Waits until every task answers at its address.

  TensorFlow's parameter-server strategy waits for every worker and ps
  without limit and without a word when one is missing (measured: minutes,
  in `context.ensure_initialized`). This says which tasks do not answer,
  after `FIRST_REPORT_SECONDS` then every `REPORT_SECONDS`, and gives up
  after `timeout` seconds (`runtime.cluster_wait_timeout`; None: never).

  Args:
    tasks: Name (`ps 0`) -> `host:port`.
    timeout: Seconds to wait at most; None waits as long as it takes.
    probe_fn: `probe`; tests pass their own.
    clock: Seconds, monotonic.
    sleep: Waits a number of seconds.

  Raises:
    errors.RunError: After `timeout` seconds with a task not answering,
      naming each.
  """
  start = clock()
  report_at = start + FIRST_REPORT_SECONDS
  reported = False
  while True:
    missing = {name: why for name, why in (
        (name, probe_fn(address)) for name, address in tasks.items()) if why}
    waited = clock() - start
    if not missing:
      if reported:
        console.waiting(
            f"cluster | every task answers (after {waited:.0f} s)")
      return
    names = ", ".join(f"{name} at {tasks[name]} ({why})"
                      for name, why in missing.items())
    if timeout is not None and waited >= timeout:
      fix = ("start them with their commands, or correct their addresses"
             if len(missing) > 1 else
             "start it with its command, or correct its address")
      raise errors.RunError(
          f"{names} did not answer within {timeout:g} s "
          f"(`runtime.cluster_wait_timeout`): {fix} in TF_CONFIG; nothing "
          "was trained or written")
    if clock() >= report_at:
      limit = ("" if timeout is None else
               f"; the chief gives up after {timeout:g} s, "
               "`runtime.cluster_wait_timeout`")
      # Printed at once, though the chief waits while its run is built.
      console.waiting(f"cluster | waiting for {names} to answer "
                      f"({waited:.0f} s{limit})")
      reported = True
      report_at = clock() + REPORT_SECONDS
    sleep(PROBE_SECONDS)
