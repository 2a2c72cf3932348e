"""Parameter-server training, in one place: what each role runs, the
strategy and how it shards variables, the coordinator, and the trainer that
schedules steps on the workers.

It runs on TensorFlow's own machinery. TF_CONFIG names chief, worker and ps
tasks (and optionally an `evaluator`). Workers and parameter servers start a
`tf.distribute.Server` and serve until stopped (`cluster.serve_forever`);
the chief builds a `ParameterServerStrategy` and a `ClusterCoordinator`,
which schedules each step on a free worker; the evaluator task evaluates the
chief's checkpoints as a sidecar (`--mode=continuous_eval`, no strategy).

Variables too large for one parameter server are split along their first
axis by one of TensorFlow's partitioners (`runtime.variable_partitioner`),
into a `ShardedVariable` whose shards sit on different ps tasks. A
checkpoint holds each sharded variable whole (its optimizer slots too), so
it restores under any other strategy, and any checkpoint restores into
shards (tests/test_sharded_variables.py).
"""

import contextlib
import inspect
import math
import re
from typing import Any, Dict, List, Optional, Tuple

import tensorflow as tf

from trainer import checks
from trainer import config as config_lib
from trainer import console
from trainer import errors
from trainer.distribute import cluster
from trainer.distribute import placement
from trainer.loop import runners
from trainer.report import tf_logs

# `runtime.variable_partitioner` -> TensorFlow's partitioner class.
PARTITIONERS = {
    "min_size": tf.distribute.experimental.partitioners.MinSizePartitioner,
    "max_size": tf.distribute.experimental.partitioners.MaxSizePartitioner,
    "fixed_shards":
        tf.distribute.experimental.partitioners.FixedShardsPartitioner,
}


def uses(strategy: tf.distribute.Strategy) -> bool:
  """Whether `strategy` trains on a parameter-server cluster."""
  return isinstance(strategy,
                    tf.distribute.experimental.ParameterServerStrategy)


def check_partitioner(strategy: str, name: Optional[str],
                      args: Optional[Dict[str, Any]]) -> None:
  """Checks `runtime.variable_partitioner` and its arguments by building
  the partitioner.

  Raises:
    errors.ConfigError: For a partitioner without `parameter_server`, an
      unknown name, or arguments its class does not take or refuses.
  """
  if name is None:
    if args is not None:
      raise errors.ConfigError(
          "`runtime.variable_partitioner_args` needs "
          "`runtime.variable_partitioner`.")
    return
  if strategy != "parameter_server":
    raise errors.ConfigError(
        "`runtime.variable_partitioner` shards variables over parameter "
        f"servers: it needs 'parameter_server', not '{strategy}'.")
  _partitioner(name, args)


def _partitioner(name: str, args: Optional[Dict[str, Any]]):
  """Builds TensorFlow's partitioner `name` with `args`.

  Raises:
    errors.ConfigError: See `check_partitioner`.
  """
  checks.choice("runtime.variable_partitioner", name, PARTITIONERS,
                optional=True)
  if args is not None and not isinstance(args, dict):
    raise errors.ConfigError(
        f"`runtime.variable_partitioner_args` ({args!r}) must be a dict of "
        "keyword arguments, or None.")
  args = args or {}
  partitioner_class = PARTITIONERS[name]
  parameters = inspect.signature(partitioner_class).parameters
  unknown = sorted(set(args) - set(parameters))
  if unknown:
    raise errors.ConfigError(
        f"`runtime.variable_partitioner_args` has {', '.join(unknown)}, "
        f"which '{name}' does not take; it takes: "
        f"{', '.join(parameters)}.")
  missing = [p.name for p in parameters.values()
             if p.default is p.empty and p.name not in args]
  if missing:
    raise errors.ConfigError(
        f"`runtime.variable_partitioner` '{name}' needs "
        f"`runtime.variable_partitioner_args` with {', '.join(missing)}.")
  for arg, value in args.items():
    # Every argument of TensorFlow's partitioners is a count of bytes or of
    # shards; `max_shards` of 'max_size' may be None (no limit).
    checks.require(
        (checks.is_int(value) and value > 0) or (
            value is None and parameters[arg].default is None),
        f"`runtime.variable_partitioner_args` {arg} ({value!r}) must be a "
        "positive integer.")
  return partitioner_class(**args)


def create_strategy(partitioner: Optional[str],
                    partitioner_args: Optional[Dict[str, Any]],
                    wait_timeout: Optional[float] = None
                    ) -> tf.distribute.Strategy:
  """Builds the chief's `ParameterServerStrategy` from TF_CONFIG, once its
  workers and parameter servers answer (`cluster.wait_for_tasks`, at most
  `wait_timeout` seconds).

  Model Garden's `distribute_utils` builds one without a partitioner, so
  this builds it directly.

  Raises:
    errors.ConfigError: Without TF_CONFIG.
    errors.RunError: If a task does not answer within `wait_timeout`.
  """
  if cluster.read_tf_config() is None:
    raise errors.ConfigError(
        "'parameter_server' needs TF_CONFIG with chief, worker and ps tasks.")
  resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
  spec = resolver.cluster_spec()
  # The strategy connects to each of them, and waits for any missing.
  cluster.wait_for_tasks(
      {f"{task_type} {index}": spec.task_address(task_type, index)
       for task_type in ("ps", "worker")
       for index in range(cluster.num_tasks(task_type, spec))},
      wait_timeout)
  return tf.distribute.experimental.ParameterServerStrategy(
      resolver,
      variable_partitioner=(_partitioner(partitioner, partitioner_args)
                            if partitioner else None))


def shard_lines(variables: List[tf.Variable]) -> List[str]:
  """Returns a line per sharded variable: its shards and the ps task each
  sits on, read back from the variables.

  E.g. `embedding/embeddings [65536, 16] in 2 shards: [32768, 16] on
  /job:ps/task:1/device:CPU:0, [32768, 16] on /job:ps/task:0/device:CPU:0`.
  """
  lines, seen = [], set()
  for variable in variables:
    sharded = getattr(variable, "_sharded_container", None)
    container = sharded() if callable(sharded) else None
    if container is None or id(container) in seen:
      continue
    seen.add(id(container))
    parts = ", ".join(
        f"{shard.shape.as_list()} on {placement.short_device(shard.device)}"
        for shard in container.variables)
    # The strategy names the shards `<name>/part_<i>`, not the container.
    name = container.variables[0].name.split(":")[0].rsplit("/part_", 1)[0]
    lines.append(f"{name} {container.shape.as_list()} in "
                 f"{len(container.variables)} shards: {parts}")
  return lines


def role_runtime(runtime: "trainer.runtime.RuntimeConfig", mode: str,
                 config: config_lib.TrainerConfig
                 ) -> Tuple[Optional["trainer.runtime.RuntimeConfig"], str]:
  """Acts on this process's role in the cluster.

  Returns:
    (None, mode) after serving as a worker or ps (until stopped);
    otherwise the runtime and mode to train (chief) or evaluate
    (`cluster.evaluator_role`) with.

  Raises:
    errors.ConfigError: If the role cannot run `mode`, or for settings
      parameter servers do not support.
  """
  if config.on_nonfinite == "rollback":
    raise errors.ConfigError(
        "`trainer.on_nonfinite='rollback'` is not supported with "
        "'parameter_server': use 'stop' and restart.")
  role, index = cluster.task_role()
  if role in ("worker", "ps"):
    cluster.serve_forever(role, index)
    return None, mode
  if role == "evaluator":
    return cluster.evaluator_role(runtime, mode)
  if mode != "train":
    raise errors.ConfigError(
        "with 'parameter_server' the chief runs --mode=train; evaluation "
        "runs in an `evaluator` task (--mode=continuous_eval).")
  return runtime, mode


_PS_TASK = re.compile(r"/job:ps/(?:replica:\d+/)?task:(\d+)")
# gRPC's reason: "last error: UNKNOWN: ipv4:127.0.0.1:46041: Failed to
# connect to remote host: Connection refused" (or another socket error).
_LAST_ERROR = re.compile(r"last error: (?:[A-Z_]+: )?(?:ipv[46]:\S+: )?"
                         r"(?:Failed to connect to remote host: )?"
                         r"([^\n\"{}]+)")
# gRPC's words for a peer gone, in an error of another type than
# `UnavailableError` (its status 14).
_CONNECTION_LOST = re.compile(r"failed to connect to all addresses|"
                              r"Connection reset by peer|Socket closed")


def lost_ps(error: tf.errors.OpError) -> Optional[errors.RunError]:
  """Says which parameter server `error` lost, and what to do; None if it
  names none, or no lost connection (a worker's loss the coordinator
  recovers from; a ps op's own failure).

  TensorFlow's message is gRPC's, several hundred characters: `failed to
  connect to all addresses; ... remote target /job:ps/replica:0/task:0/...`
  or `recvmsg:Connection reset by peer ... /job:ps/replica:0/task:0/device:
  CPU:0 while calling /tensorflow.eager.EagerService/Enqueue` (measured, the
  ps killed in a loop or between loops: an `UnavailableError` each time).
  """
  found = _PS_TASK.search(error.message)
  if found is None or not (
      isinstance(error, tf.errors.UnavailableError) or
      _CONNECTION_LOST.search(error.message)):
    return None
  index = int(found.group(1))
  spec = tf.distribute.cluster_resolver.TFConfigClusterResolver(
  ).cluster_spec()
  address = spec.task_address("ps", index)
  reason = _LAST_ERROR.search(error.message)
  return errors.RunError(
      f"ps {index} at {address} is unreachable"
      f"{f' ({reason.group(1).strip()})' if reason else ''}: the variables "
      "it held are lost; the checkpoints saved before stay: restart it, "
      "then run the chief's command again to resume from the newest")


@contextlib.contextmanager
def naming_lost_ps():
  """Turns the error of a parameter server gone into `lost_ps`'s line,
  wherever the chief meets it: creating or restoring the variables, in a
  loop, reading its metrics, saving, evaluating.

  Raises:
    errors.RunError: For a lost parameter server, naming it.
  """
  try:
    yield
  except tf.errors.OpError as e:
    lost = lost_ps(e)
    if lost is None:
      raise
    raise lost from e


class ScheduledTaskTrainer(runners.TaskTrainer):
  """A `TaskTrainer` whose steps a `ClusterCoordinator` schedules on the
  parameter-server cluster's workers.

  Steps run asynchronously; a loop waits for all of its steps (`join`), so
  the step count is exact when it returns. Each worker reads its own shard
  of a per-worker dataset, which cannot be checkpointed.
  """

  def __init__(self, task, model, optimizer,
               strategy: tf.distribute.Strategy, train_input, global_step,
               **options):
    """Builds the coordinator and the trainer; see `TaskTrainer`."""
    self._coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    tf_logs.condense_coordinator_logs()
    self._num_workers = cluster.num_tasks("worker")
    console.info(f"cluster | coordinator schedules steps on "
                 f"{self._num_workers} worker(s); variables on "
                 f"{cluster.num_tasks('ps')} ps")
    if self._num_workers > 1:
      console.info(f"input | worker i of {self._num_workers} reads examples "
                   f"i, i + {self._num_workers}, ... of the task's training "
                   "data")
    # Its loop schedules single steps; the loss-scaling check needs the
    # replicas of one step side by side.
    options["check_loss_scaling"] = False
    super().__init__(task, model, optimizer, strategy, train_input,
                     global_step, **options)

  def _host_scope(self):
    # Workers only reach variables created in the strategy scope.
    return self.strategy.scope()

  def _train_dataset(self):
    # Per-worker iterators cannot be checkpointed; Orbit makes one.
    self.train_iterator = None
    return self._coordinator.create_per_worker_dataset(
        self._input.per_worker_dataset_fn(self._num_workers))

  def input_resumption(self, input_position: str, num_workers: int) -> str:
    del input_position, num_workers  # Steps run in no fixed order.
    console.info("input | parameter_server: the input position is not "
                 "checkpointed; a restarted run reads each worker's shard "
                 "from its start")
    return "restart"

  def _measures_input_wait(self) -> bool:
    return False  # Workers have no chief variable to add to.

  def create_train_loop_fn(self):
    """Returns a loop that schedules each step on a free worker."""
    step = tf.function(self.train_step)

    def loop(iterator, num_steps):
      losses = [self._coordinator.schedule(step, args=(iterator,))
                for _ in range(int(num_steps))]
      self._coordinator.join()
      values = [float(loss.fetch()) for loss in losses]
      # Steps ran asynchronously: the first scheduled non-finite one counts.
      bad = [i for i, value in enumerate(values) if not math.isfinite(value)]
      reached = int(self.global_step.numpy())
      first = reached - len(values) + 1
      self._status.assign(tf.stack([
          tf.constant(sum(values) / len(values), tf.float64),
          tf.constant(first + bad[0] if bad else -1, tf.float64),
          self._scheduled_rate(), tf.constant(reached, tf.float64)]))

    return loop
