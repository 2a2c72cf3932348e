"""The distribution strategy a `RuntimeConfig` names, and the process set up
for it: the settings checked that need this package, the cluster joined,
GPUs and CPU devices prepared.

Strategies come from Model Garden's `official.common.distribute_utils`
where it builds them; what it lacks (a mirrored strategy over logical CPUs,
central storage, the parameter-server strategy with a partitioner) is built
here or in `trainer.distribute.parameter_server`.
"""

from typing import Optional

import tensorflow as tf
from official.common import distribute_utils
from official.utils.misc import keras_utils

from trainer import checks
from trainer import errors
from trainer import runtime as runtime_lib
from trainer.distribute import cluster
from trainer.distribute import devices
from trainer.distribute import parameter_server
from trainer.distribute import placement
from trainer.distribute import slurm


def check(config: runtime_lib.RuntimeConfig) -> None:
  """Checks the settings that need this package's modules: the worker
  hosts, the port range and the variable partitioner. (`RuntimeConfig`
  checks the rest on construction; it sits below this package.)

  Raises:
    errors.ConfigError: For a malformed `runtime.worker_hosts` or a
      `runtime.task_index` outside it, a `runtime.port_base` too high, or a
      partitioner that cannot be built (`parameter_server.check_partitioner`).
  """
  if config.worker_hosts is not None:
    hosts = cluster.parse_worker_hosts(config.worker_hosts)
    # One host may leave the index unset (-1: the only worker).
    unset_alone = len(hosts) == 1 and config.task_index == -1
    checks.require(
        0 <= config.task_index < len(hosts) or unset_alone,
        f"`runtime.task_index` ({config.task_index}) must be in [0, "
        f"{len(hosts)}) for {len(hosts)} `runtime.worker_hosts`.")
  if config.port_base is not None:
    checks.require(
        config.port_base + 64 <= slurm.MAX_PORT,
        f"`runtime.port_base` ({config.port_base}) leaves no room for a "
        f"node's tasks below port {slurm.MAX_PORT}.")
  parameter_server.check_partitioner(
      config.distribution_strategy, config.variable_partitioner,
      config.variable_partitioner_args)


def set_up(config: runtime_lib.RuntimeConfig) -> cluster.Membership:
  """Sets this process up for `config`, once, before anything is written:
  checks the settings (`check`) and joins the cluster
  (`cluster.configure`).

  Returns:
    How this process joined its cluster; pass it to `create_strategy`.

  Raises:
    errors.ConfigError: See `check` and `cluster.configure`.
  """
  check(config)
  return cluster.configure(config)


def configure_devices(config: runtime_lib.RuntimeConfig) -> None:
  """Splits the host CPU into `config.num_cpu_devices` logical devices.

  Must run before TensorFlow initialises its devices; afterwards it succeeds
  only if the CPU is already split that way.

  Raises:
    errors.ConfigError: If devices were initialised with a different split.
  """
  if config.num_cpu_devices > 1:
    devices.split_cpu(config.num_cpu_devices, "runtime.num_cpu_devices")


def configure_threads(config: runtime_lib.RuntimeConfig) -> None:
  """Applies the GPU thread settings (environment variables TensorFlow reads
  when it starts its GPUs) through Model Garden's `keras_utils`."""
  if config.gpu_thread_mode is not None:
    keras_utils.set_gpu_thread_mode_and_count(
        config.gpu_thread_mode, config.dataset_num_private_threads,
        config.num_gpus, config.per_gpu_thread_count)


def create_strategy(config: runtime_lib.RuntimeConfig,
                    membership: Optional[cluster.Membership] = None
                    ) -> tf.distribute.Strategy:
  """Builds the distribution strategy that `config` names.

  Args:
    config: The runtime settings.
    membership: `set_up`'s answer; None sets the process up here (a script
      that builds only a strategy).

  Raises:
    errors.ConfigError: For settings `check` refuses, a bad cluster
      description, or a TPU that cannot be reached.
  """
  if membership is None:
    membership = set_up(config)
  cluster.restrict_gpus(membership)
  configure_threads(config)
  configure_devices(config)
  # Splits the CPU for model parallelism before the strategy starts the
  # devices; the model is built on the same devices (`trainer.state`).
  placement.configure(config.model_parallel_devices)
  strategy = config.distribution_strategy
  if strategy == "default":
    return tf.distribute.get_strategy()
  if strategy == "parameter_server":
    return parameter_server.create_strategy(
        config.variable_partitioner, config.variable_partitioner_args,
        config.cluster_wait_timeout)
  if strategy == "central_storage":
    # `distribute_utils` has no central storage; variables on the CPU, compute
    # on every GPU (or the CPU when there is none).
    return tf.distribute.experimental.CentralStorageStrategy()
  if strategy == "tpu":
    return _tpu_strategy(config.tpu)
  if (strategy == "mirrored" and config.num_gpus == 0 and
      config.num_cpu_devices > 1):
    # `distribute_utils` only mirrors over GPUs; logical CPUs are our addition.
    # Reducing on one device rather than with collectives: a second
    # collective strategy in the same process (a notebook, a test session)
    # reuses collective instance keys and fails with a shape mismatch.
    return tf.distribute.MirroredStrategy(
        devices=[f"/cpu:{i}" for i in range(config.num_cpu_devices)],
        cross_device_ops=tf.distribute.ReductionToOneDevice("/cpu:0"))
  return distribute_utils.get_distribution_strategy(
      distribution_strategy=strategy,
      num_gpus=config.num_gpus,
      all_reduce_alg=config.all_reduce_alg,
      num_packs=config.num_packs)


def _tpu_strategy(tpu: str) -> tf.distribute.Strategy:
  """Builds the TPU strategy for `runtime.tpu`.

  Raises:
    errors.ConfigError: If no TPU answers there.
  """
  try:
    return distribute_utils.get_distribution_strategy(
        distribution_strategy="tpu", tpu_address=tpu)
  except (ValueError, tf.errors.OpError) as e:
    # TensorFlow's first sentence says what is missing; the rest is noise.
    message = (str(e).strip().splitlines() or [""])[0].split(". ")[0]
    raise errors.ConfigError(
        f"no TPU reachable at `runtime.tpu` ({tpu!r}): {message}") from e
