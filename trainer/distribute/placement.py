"""Model parallelism by hand: parts of one model on different devices.

TensorFlow's engine for it is device placement: variables created and ops
run inside `tf.device(d)` live and run on `d`, and TensorFlow copies a
tensor to the next device where one part feeds another. With
`runtime.model_parallel_devices` N > 1, `configure` picks N devices: N GPUs
when the host has them, else the host CPU split into N logical devices
(which checks a split on a machine without accelerators; it is not faster).

A Task places its parts with `devices(num_parts)` in `build_model` (or
builds a `StagedModel`), and the same code runs whole on one device when
model parallelism is off. The framework builds the model inside
`building(configure(N))`, which is what `devices` reads. The default train
step computes the backward pass of each part on that part's device
(`gradients`).

Here each part waits for the one before it; `trainer.distribute.pipeline`
feeds the parts in micro-batches so that every device works at once. What
TensorFlow does not offer, and this module does not pretend to: automatic
splitting of a layer or a graph over devices (TPUStrategy's
`experimental_split_to_logical_devices` is TPU-only).
"""

import contextlib
import contextvars
from typing import Iterator, List, Optional, Sequence

import tensorflow as tf
import tf_keras

from trainer import errors
from trainer import graph_code
from trainer import user_errors
from trainer.distribute import devices as devices_lib

# The devices of the model being built (`building`); empty outside, and
# when model parallelism is off. A scope the framework sets around
# `build_model`, rather than an argument: a Task's `build_model()` and a
# `StagedModel` keep their signatures, so one model definition runs split or
# whole, and nothing outlives the build (a next run, a next test, starts
# unsplit). A context variable keeps each thread's build its own.
_building: contextvars.ContextVar = contextvars.ContextVar(
    "model_parallel_devices", default=())


def configure(num_devices: int) -> List[str]:
  """Picks the devices for `num_devices`-way model parallelism.

  Must run before TensorFlow initialises its devices when the CPU is to be
  split; afterwards it returns the same devices for the same count. 0 or 1
  turns model parallelism off.

  Returns:
    The device names, e.g. `["/device:GPU:0", "/device:GPU:1"]`.

  Raises:
    errors.ConfigError: If the host has GPUs, but fewer than `num_devices`,
      or TensorFlow already split the CPU otherwise.
  """
  if num_devices <= 1:
    return []
  return devices_lib.first_devices(
      num_devices, "runtime.model_parallel_devices",
      needs=f"`runtime.model_parallel_devices` ({num_devices}) parts")


@contextlib.contextmanager
def building(model_devices: Sequence[str]) -> Iterator[None]:
  """Makes `devices` (and `StagedModel`) place parts on `model_devices`
  (`configure`'s) while the model is built; fewer than 2 leaves placement
  to TensorFlow."""
  token = _building.set(tuple(model_devices))
  try:
    yield
  finally:
    _building.reset(token)


def devices(num_parts: int) -> List[Optional[str]]:
  """Returns the device of each of `num_parts` consecutive model parts.

  The parts are spread evenly in order: with 2 devices, 4 parts go to
  devices 0, 0, 1, 1. With model parallelism off every part gets None, for
  which `tf.device(None)` leaves placement to TensorFlow, so one model
  definition serves both.

  Raises:
    errors.ConfigError: If `num_parts` is not positive, naming the user's
      code that asked (`user_errors.at_caller`).
  """
  if num_parts < 1:
    raise errors.ConfigError(user_errors.at_caller(
        f"`num_parts` ({num_parts}) must be positive."))
  model_devices = _building.get()
  if len(model_devices) < 2:
    return [None] * num_parts
  return [model_devices[part * len(model_devices) // num_parts]
          for part in range(num_parts)]


@graph_code.written_for_graphs
def gradients(tape: tf.GradientTape, loss: tf.Tensor,
              variables: Sequence[tf.Variable]) -> List[Optional[tf.Tensor]]:
  """Returns the gradients of `loss`; each on its forward op's device when
  the variables sit on several devices of this process.

  `GradientTape.gradient` creates every gradient op on the device of its
  caller, so the backward pass of a part on device 1 would run on device 0
  (measured: 3 of the 4 backward MatMuls of a two-device MLP). Inside a
  `tf.function`, `tf.gradients` puts each gradient op beside its forward op
  instead (measured: the backward MatMuls of each part on its own device).
  Eagerly (`runtime.run_eagerly`) there is no graph to do that in: the tape
  decides.

  The variables say where the parts live: the step is traced after the
  build (and its `building` scope) ended, and so needs no setting of its
  own. A parameter server's or another worker's variables do not count:
  their updates are the strategy's business.
  """
  if len(local_devices(variables)) > 1 and not tf.executing_eagerly():
    return tf.gradients(loss, list(variables))
  return tape.gradient(loss, variables)


@graph_code.written_for_graphs
def local_devices(variables: Sequence[tf.Variable]) -> List[str]:
  """Returns the devices of this process that `variables` sit on, sorted."""
  found = set()
  for variable in variables:
    device = getattr(variable, "device", None)
    if device and tf.DeviceSpec.from_string(device).job in (None,
                                                            "localhost"):
      found.add(short_device(device))
  return sorted(found)


def variables_by_device(model: tf_keras.Model) -> List[str]:
  """Returns one line per device: where `model`'s weights live, read back
  from the variables.

  E.g. `/device:CPU:1: 2 variable(s), 1,290 parameters (logits/kernel,
  logits/bias)`; a parameter server's device starts with `/job:ps/task:1`.
  """
  found = {}
  for variable in model.weights:
    found.setdefault(short_device(variable.device), []).append(variable)
  lines = []
  for device, variables in sorted(found.items()):
    size = sum(v.shape.num_elements() for v in variables)
    names = ", ".join(
        v.name.split(":")[0].removeprefix(f"{model.name}/")
        for v in variables[:4])
    more = ", ..." if len(variables) > 4 else ""
    lines.append(f"{device}: {len(variables)} variable(s), {size:,} "
                 f"parameters ({names}{more})")
  return lines


def short_device(device: str) -> str:
  """Returns `device` without what every device of this process shares:
  `/device:CPU:1` for a local one, `/job:ps/task:1/device:CPU:0` for a
  parameter server's."""
  spec = tf.DeviceSpec.from_string(device)
  short = f"/device:{spec.device_type}:{spec.device_index}"
  if spec.job not in (None, "localhost"):
    short = f"/job:{spec.job}/task:{spec.task}{short}"
  return short


class StagedModel(tf_keras.Model):
  """Runs stages of layers one after another, stage i on device i.

  The manual model parallelism of TensorFlow's guides, as a model: each
  stage's weights are created and its ops run inside `tf.device` of its
  device (`devices(len(stages))`); TensorFlow copies the activations from
  one device to the next. With model parallelism off it is a plain stack
  of the same layers.
  """

  def __init__(self, stages: Sequence[Sequence[tf_keras.layers.Layer]],
               name: Optional[str] = None):
    """Builds the model.

    Args:
      stages: The layers of each stage, in order.
      name: The model's name.

    Raises:
      errors.ConfigError: If there is no stage or an empty one, naming the
        user's code that built it (`user_errors.at_caller`).
    """
    super().__init__(name=name)
    if not stages or not all(stages):
      raise errors.ConfigError(user_errors.at_caller(
          "`stages` must be non-empty lists of layers."))
    self.stages = [list(stage) for stage in stages]
    self.stage_devices = devices(len(self.stages))

  def call(self, inputs, training=None):
    outputs = inputs
    for stage, device in zip(self.stages, self.stage_devices):
      # Weights are created at the first call, so they land here too.
      with tf.device(device):
        for layer in stage:
          outputs = layer(outputs, training=training)
    return outputs
