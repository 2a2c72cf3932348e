"""The host CPU split into logical devices, written once.

Several replicas (`runtime.num_cpu_devices`), model parallelism
(`runtime.model_parallel_devices`) and the tests exercise several devices on
a CPU-only host by splitting the CPU, which TensorFlow allows only before it
initialises its devices.
"""

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
