"""Runtime settings: devices, distribution strategy and numeric precision.

`RuntimeConfig` is bound in gin as `runtime.<name>`. `create_strategy` turns it
into a `tf.distribute.Strategy` through Model Garden's
`official.common.distribute_utils`, and `set_precision_policy` applies the
tf_keras mixed-precision policy through `official.modeling.performance`.
"""

import dataclasses
from typing import Optional, Union

import gin
import tensorflow as tf
import tf_keras
from official.common import distribute_utils
from official.modeling import performance

from trainer import errors

STRATEGIES = ("default", "one_device", "mirrored", "multi_worker_mirrored",
              "parameter_server", "central_storage", "tpu")
# Strategies whose cluster wiring (TF_CONFIG, coordinators, TPU system
# initialisation) is not built yet; asking for one fails before any work.
_NOT_YET_SUPPORTED = ("multi_worker_mirrored", "parameter_server",
                      "central_storage", "tpu")
PRECISIONS = ("float32", "float16", "bfloat16")
MIRRORED_ALL_REDUCE_ALGS = ("nccl", "hierarchical_copy")


@gin.configurable("runtime")
@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
  """Where and how training runs; every field is checked on construction.

  Attributes:
    distribution_strategy: One of `STRATEGIES`. `default` is TensorFlow's
      default (no-op) strategy.
    mixed_precision_dtype: `float32`, `float16` (with loss scaling) or
      `bfloat16`. Variables stay float32 either way.
    loss_scale: `'dynamic'` or a positive number; used with `float16` only.
    all_reduce_alg: For `mirrored`: `nccl` or `hierarchical_copy`; None lets
      TensorFlow choose.
    num_packs: Gradient packing for `mirrored`'s all-reduce.
    run_eagerly: Run train and eval steps without `tf.function`, so Python
      breakpoints and prints work inside them.
    worker_hosts: Comma-separated `host:port` list of a multi-worker cluster.
    task_index: This process's index in `worker_hosts`.
    enable_xla: Compile the per-replica computation with XLA (`jit_compile`).
    tpu: TPU address for `TPUClusterResolver`.
    num_gpus: GPUs used by `one_device` (at most 1) and `mirrored`.
    num_cpu_devices: Split the host CPU into this many logical devices, so
      `mirrored` runs that many replicas on a machine without accelerators.
      0 or 1 leaves the CPU whole.
    seed: Seeds Python, NumPy and TensorFlow before the model is built, so
      runs start from the same weights; None leaves them unseeded.
  """
  distribution_strategy: str = "default"
  mixed_precision_dtype: str = "float32"
  loss_scale: Union[str, float] = "dynamic"
  all_reduce_alg: Optional[str] = None
  num_packs: int = 1
  run_eagerly: bool = False
  worker_hosts: Optional[str] = None
  task_index: int = -1
  enable_xla: bool = False
  tpu: Optional[str] = None
  num_gpus: int = 0
  num_cpu_devices: int = 0
  seed: Optional[int] = None

  def __post_init__(self):
    _check_choice("distribution_strategy", self.distribution_strategy,
                  STRATEGIES)
    _check_choice("mixed_precision_dtype", self.mixed_precision_dtype,
                  PRECISIONS)
    if self.loss_scale != "dynamic" and not (
        _is_number(self.loss_scale) and self.loss_scale > 0):
      raise errors.ConfigError(
          f"`runtime.loss_scale` ({self.loss_scale!r}) must be "
          "'dynamic' or a positive number.")
    for name in ("num_packs", "num_gpus", "num_cpu_devices", "task_index"):
      if not _is_int(getattr(self, name)):
        raise errors.ConfigError(
            f"`runtime.{name}` ({getattr(self, name)!r}) must be "
            "an integer.")
    if self.seed is not None and not _is_int(self.seed):
      raise errors.ConfigError(f"`runtime.seed` ({self.seed!r}) must be an "
                               "integer or None.")
    for name in ("run_eagerly", "enable_xla"):
      if not isinstance(getattr(self, name), bool):
        raise errors.ConfigError(
            f"`runtime.{name}` ({getattr(self, name)!r}) must be "
            "True or False.")
    if self.num_packs < 1:
      raise errors.ConfigError(
          f"`runtime.num_packs` ({self.num_packs}) must be >= 1.")
    if self.num_gpus < 0 or self.num_cpu_devices < 0:
      raise errors.ConfigError(
          "`runtime.num_gpus` and `runtime.num_cpu_devices` must "
          "not be negative.")
    if self.distribution_strategy in _NOT_YET_SUPPORTED:
      raise errors.ConfigError(
          f"`runtime.distribution_strategy` '{self.distribution_strategy}' is "
          "not yet supported; use 'default', 'one_device' or 'mirrored'.")
    if self.worker_hosts is not None or self.task_index != -1:
      raise errors.ConfigError(
          "`runtime.worker_hosts` and `runtime.task_index` need a "
          "multi-worker strategy, which is not yet supported.")
    if self.tpu is not None:
      raise errors.ConfigError(
          "`runtime.tpu` needs `distribution_strategy='tpu'`, "
          "which is not yet supported.")
    if self.all_reduce_alg is not None:
      if self.distribution_strategy != "mirrored":
        raise errors.ConfigError(
            "`runtime.all_reduce_alg` applies to 'mirrored' only, "
            f"not '{self.distribution_strategy}'.")
      _check_choice("all_reduce_alg", self.all_reduce_alg,
                    MIRRORED_ALL_REDUCE_ALGS)
    if self.num_gpus and self.num_cpu_devices > 1:
      raise errors.ConfigError(
          "`runtime.num_gpus` and `runtime.num_cpu_devices` "
          "cannot both be set: replicas are GPUs or CPUs.")
    if self.enable_xla and self.distribution_strategy == "mirrored":
      raise errors.ConfigError("`runtime.enable_xla` is not yet supported with "
                       "'mirrored'; use 'default' or 'one_device'.")
    if self.distribution_strategy in ("default", "one_device"):
      if self.num_gpus > 1 or self.num_cpu_devices > 1:
        raise errors.ConfigError(
            f"'{self.distribution_strategy}' runs on one device; use "
            "`runtime.distribution_strategy='mirrored'` for several.")


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_choice(name: str, value, choices) -> None:
  if value not in choices:
    raise errors.ConfigError(f"`runtime.{name}` ({value!r}) must be one of: "
                     f"{', '.join(choices)}.")


def configure_devices(config: RuntimeConfig) -> None:
  """Splits the host CPU into `config.num_cpu_devices` logical devices.

  Must run before TensorFlow initialises its devices; afterwards it succeeds
  only if the CPU is already split that way.

  Raises:
    errors.ConfigError: If devices were initialised with a different split.
  """
  if config.num_cpu_devices <= 1:
    return
  cpu = tf.config.list_physical_devices("CPU")[0]
  wanted = [tf.config.LogicalDeviceConfiguration()] * config.num_cpu_devices
  try:
    tf.config.set_logical_device_configuration(cpu, wanted)
  except RuntimeError as e:
    have = len(tf.config.list_logical_devices("CPU"))
    if have != config.num_cpu_devices:
      raise errors.ConfigError(
          f"`runtime.num_cpu_devices` ({config.num_cpu_devices}) cannot be "
          f"applied: TensorFlow already initialised {have} CPU device(s). Set "
          "it before any TensorFlow op runs.") from e


def create_strategy(config: RuntimeConfig) -> tf.distribute.Strategy:
  """Builds the distribution strategy that `config` names."""
  configure_devices(config)
  if config.distribution_strategy == "default":
    return tf.distribute.get_strategy()
  if (config.distribution_strategy == "mirrored" and config.num_gpus == 0 and
      config.num_cpu_devices > 1):
    # `distribute_utils` only mirrors over GPUs; logical CPUs are our addition.
    # Reducing on one device rather than with collectives: a second
    # collective strategy in the same process (a notebook, a test session)
    # reuses collective instance keys and fails with a shape mismatch.
    return tf.distribute.MirroredStrategy(
        devices=[f"/cpu:{i}" for i in range(config.num_cpu_devices)],
        cross_device_ops=tf.distribute.ReductionToOneDevice("/cpu:0"))
  return distribute_utils.get_distribution_strategy(
      distribution_strategy=config.distribution_strategy,
      num_gpus=config.num_gpus,
      all_reduce_alg=config.all_reduce_alg,
      num_packs=config.num_packs)


def seed_everything(config: RuntimeConfig) -> None:
  """Seeds Python, NumPy and TensorFlow from `config.seed` if it is set."""
  if config.seed is not None:
    tf_keras.utils.set_random_seed(config.seed)


def set_precision_policy(config: RuntimeConfig) -> None:
  """Sets the global tf_keras mixed-precision policy from `config`."""
  performance.set_mixed_precision_policy(
      tf.dtypes.as_dtype(config.mixed_precision_dtype))


def wrap_optimizer(optimizer: tf_keras.optimizers.Optimizer,
                   config: RuntimeConfig) -> tf_keras.optimizers.Optimizer:
  """Adds loss scaling to `optimizer` when training in float16."""
  loss_scale = None if config.loss_scale == "dynamic" else config.loss_scale
  return performance.configure_optimizer(
      optimizer,
      use_float16=config.mixed_precision_dtype == "float16",
      loss_scale=loss_scale)
