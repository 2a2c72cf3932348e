"""The host CPU split into logical devices, written once.

Several replicas (`runtime.num_cpu_devices`), model parallelism
(`runtime.model_parallel_devices`), pipeline stages and the tests exercise
several devices on a CPU-only host by splitting the CPU, which TensorFlow
allows only before it initialises its devices. `first_devices` is the one
choice model parallelism and pipelines make: GPUs where there are, else the
split CPU.
"""

from typing import List

import tensorflow as tf

from trainer import errors


def split_cpu(count: int, setting: str, effect: str = "be applied") -> None:
  """Splits the host CPU into `count` logical devices.

  Must run before TensorFlow initialises its devices; afterwards it succeeds
  only if the CPU is already split that way.

  Args:
    count: How many logical CPU devices.
    setting: The setting that asks for them, named in the error.
    effect: What the setting cannot do, in the error ("be applied", "split
      the CPU").

  Raises:
    errors.ConfigError: "`setting` (count) cannot <effect>: TensorFlow
      already initialised N CPU device(s). ...", if it split them otherwise.
  """
  cpu = tf.config.list_physical_devices("CPU")[0]
  try:
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * count)
  except RuntimeError as e:
    have = len(tf.config.list_logical_devices("CPU"))
    if have != count:
      raise errors.ConfigError(
          f"`{setting}` ({count}) cannot {effect}: TensorFlow already "
          f"initialised {have} CPU device(s). Set it before any TensorFlow "
          "op runs.") from e


def first_devices(count: int, setting: str, needs: str) -> List[str]:
  """Returns the first `count` GPUs, or without GPUs `count` logical CPUs,
  splitting the host CPU into as many (`split_cpu`).

  Args:
    count: How many devices.
    setting: The setting that asks for them, named in the CPU error.
    needs: What needs them, for the GPU error, e.g. "the pipeline's 3
      stages".

  Raises:
    errors.ConfigError: If the host has GPUs, but fewer than `count`, or
      TensorFlow already split the CPU otherwise.
  """
  gpus = tf.config.list_physical_devices("GPU")
  if gpus:
    if len(gpus) < count:
      raise errors.ConfigError(
          f"{needs} need {count} GPUs; this host has {len(gpus)}.")
    return [f"/device:GPU:{i}" for i in range(count)]
  split_cpu(count, setting, effect="split the CPU")
  return [f"/device:CPU:{i}" for i in range(count)]
