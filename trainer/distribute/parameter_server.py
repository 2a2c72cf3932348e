"""The parameter-server strategy and how it shards variables.

It runs on TensorFlow's own machinery. TF_CONFIG names chief, worker and ps
tasks (and optionally an `evaluator`); what each role runs is in
`trainer.distribute.roles`. The chief builds the `ParameterServerStrategy`
here; the trainer that schedules its steps on the workers is
`trainer.loop.runner.scheduled_trainer`, and a lost parameter server is named by
`trainer.distribute.ps_errors`.

Variables too large for one parameter server are split along their first
axis by one of TensorFlow's partitioners (`runtime.variable_partitioner`),
into a `ShardedVariable` whose shards sit on different ps tasks. A
checkpoint holds each sharded variable whole (its optimizer slots too), so
it restores under any other strategy, and any checkpoint restores into
shards (tests/distribute/test_sharded_variables.py).
"""

import inspect
from typing import Any, Dict, List, Optional

import tensorflow as tf

from trainer import checks
from trainer import errors
from trainer.distribute import cluster
from trainer.distribute import placement

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
