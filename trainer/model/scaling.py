"""Changing the number of accelerators: batch and learning-rate rescaling.

Opt-in (`trainer.batch_scaling`). A config is written for
`trainer.reference_replicas` replicas; run on another count, either the
global batch stays fixed (each replica gets more or fewer examples, the
learning rate stays), or the per-replica batch stays fixed (the global batch
grows or shrinks with the replicas) and the learning rate follows the global
batch linearly (Goyal et al., 2017).
"""

import dataclasses
from typing import Tuple

import tensorflow as tf
import tf_keras

from trainer import errors
from trainer.model import optimization

RULES = ("keep_global_batch", "keep_per_replica_batch")


def rescale(config, num_replicas: int) -> Tuple[object, float]:
  """Returns `config` with rescaled batch sizes and the learning-rate factor.

  Args:
    config: A `TrainerConfig`; unchanged when `batch_scaling` is None.
    num_replicas: Replicas of this run.

  Raises:
    errors.ConfigError: If a rescaled batch would not be whole.
  """
  if config.batch_scaling in (None, "keep_global_batch"):
    return config, 1.0
  factor = num_replicas / config.reference_replicas
  sizes = {}
  for name in ("global_batch_size", "eval_batch_size"):
    scaled = getattr(config, name) * factor
    if scaled != int(scaled) or scaled < 1:
      raise errors.ConfigError(
          f"`trainer.{name}` ({getattr(config, name)}) cannot keep its "
          f"per-replica batch on {num_replicas} replicas (reference "
          f"{config.reference_replicas}).")
    sizes[name] = int(scaled)
  return dataclasses.replace(config, **sizes), factor


class ScaledSchedule(tf_keras.optimizers.schedules.LearningRateSchedule):
  """A learning-rate schedule multiplied by a constant factor."""

  def __init__(self, schedule, factor: float):
    self.schedule = schedule
    self.factor = factor

  def __call__(self, step):
    return self.schedule(step) * self.factor

  def get_config(self):
    return {"schedule": tf_keras.optimizers.schedules.serialize(
        self.schedule), "factor": self.factor}


def scale_learning_rate(optimizer: tf_keras.optimizers.Optimizer,
                        factor: float) -> None:
  """Multiplies `optimizer`'s learning rate (or schedule) by `factor`; each
  part's, for per-part optimizers."""
  if factor == 1.0:
    return
  for part in optimization.parts(optimizer).values():
    scale_learning_rate(part, factor)
  if optimization.parts(optimizer):
    return
  rate = optimization.get_learning_rate(optimizer)
  if isinstance(rate, tf_keras.optimizers.schedules.LearningRateSchedule):
    optimization.set_learning_rate(optimizer, ScaledSchedule(rate, factor))
  else:
    optimization.set_learning_rate(
        optimizer, float(tf.convert_to_tensor(rate)) * factor)
