"""Pipeline parallelism's stages: a model cut into K stages, each on a device.

GPipe (Huang et al., 2019) as Lingvo first wrote it in TensorFlow
(`lingvo/core/gpipe.py`): the model is a chain of K stages, stage k's
weights live on device k, and the train step (`trainer.model.pipelined`)
runs M micro-batches through the stages inside one traced step. TensorFlow's
executor then runs stage k+1 on micro-batch i while stage k runs on
micro-batch i+1, because nothing orders them: no scheduler of our own.

This module owns the settings (`PipelineConfig`, bound as `pipeline.<name>`),
the devices, and the cut: at named layers of a chain (`tf_keras.Sequential`
or a functional model whose layers follow one another), or the stages of the
Task's `placement.StagedModel`. A cut model is re-created layer by layer with
each layer's weights made on its stage's device, and the Task's initial
weights copied in: a Keras model's variables cannot move once made, and
`tf_keras.models.clone_model` already re-creates a chain exactly (names and
checkpoint keys included), so it is reused with a per-layer build.
"""

import dataclasses
from typing import Callable, List, Optional, Sequence, Tuple

import gin
import tensorflow as tf
import tf_keras

from trainer import checks
from trainer import console
from trainer import errors
from trainer import runtime as runtime_lib
from trainer.distribute import devices as devices_lib
from trainer.distribute import placement


@gin.configurable("pipeline")
@dataclasses.dataclass(frozen=True)
class PipelineConfig:
  """Pipeline parallelism (GPipe), bound as `pipeline.<name>`.

  Pipelining is on when `boundaries` or `task_stages` is set. It needs the
  `default` strategy and the Task's default `train_step`.

  Attributes:
    boundaries: Names of the layers that end a stage, in model order: K - 1
      names cut a chain of layers (a `tf_keras.Sequential`, or a functional
      model whose layers follow one another) into K stages. None: no cut.
    task_stages: Pipeline the stages of the Task's
      `trainer.distribute.placement.StagedModel` instead of `boundaries`.
    num_microbatches: M: each replica's batch (each accumulation step's,
      under `trainer.gradient_accumulation_steps`) is cut into this many
      micro-batches, which flow through the stages one after another; 1 is
      naive model parallelism.
    devices: The device of each stage, in order, e.g.
      `["/device:GPU:0", "/device:GPU:1"]`; None: the first K GPUs, or,
      without GPUs, the host CPU split into K logical devices.
    recompute: Recompute each stage's activations in the backward pass
      (`tf.recompute_grad`) instead of keeping them: less memory, one more
      forward pass. Batch-norm statistics are then updated twice.
  """
  boundaries: Optional[Tuple[str, ...]] = None
  task_stages: bool = False
  num_microbatches: int = 1
  devices: Optional[Tuple[str, ...]] = None
  recompute: bool = False

  def __post_init__(self):
    checks.field_types("pipeline", self)
    checks.integer("pipeline.num_microbatches", self.num_microbatches,
                   minimum=1)
    for name in ("boundaries", "devices"):
      value = getattr(self, name)
      if value is None:
        continue
      checks.require(
          not isinstance(value, str) and len(value) > 0 and
          all(isinstance(v, str) and v for v in value) and
          len(set(value)) == len(value),
          f"`pipeline.{name}` ({value!r}) must be a list of distinct "
          "names.")
      object.__setattr__(self, name, tuple(value))
    checks.require(
        not (self.boundaries and self.task_stages),
        "`pipeline.boundaries` and `pipeline.task_stages` both cut the "
        "model: set one.")
    changed = [name for name in ("num_microbatches", "devices", "recompute")
               if getattr(self, name) != getattr(PipelineConfig, name)]
    checks.require(
        self.enabled or not changed,
        f"`pipeline.{changed[0] if changed else ''}` needs "
        "`pipeline.boundaries` or `pipeline.task_stages`: there is no "
        "pipeline without stages.")

  @property
  def enabled(self) -> bool:
    """Whether the model is pipelined."""
    return self.boundaries is not None or self.task_stages


def set_up(config: PipelineConfig,
           runtime: runtime_lib.RuntimeConfig) -> None:
  """Refuses runtime settings a pipeline cannot run under, and splits the
  CPU for its stages where it must be: before the model is built (which
  starts TensorFlow's devices).

  Raises:
    errors.ConfigError: For another strategy than `default` (a pipeline
      places each stage itself; `one_device` would put every variable on
      one device and data-parallel strategies copy the model per replica),
      `runtime.model_parallel_devices` (which places parts of its own) or
      `runtime.enable_xla` (one device per compiled step).
  """
  if not config.enabled:
    return
  strategy = runtime.distribution_strategy
  checks.require(
      strategy == "default",
      "a pipeline (`pipeline.boundaries`/`task_stages`) needs `runtime."
      f"distribution_strategy='default'`, not '{strategy}': it places each "
      "stage on its own device, which a strategy's replicas would not keep.")
  checks.require(
      runtime.model_parallel_devices <= 1,
      "`runtime.model_parallel_devices` places the model's parts itself; "
      "a pipeline picks its devices with `pipeline.devices`: set one.")
  checks.require(
      not runtime.enable_xla,
      "`runtime.enable_xla` compiles the step for one device; it cannot be "
      "used with a pipeline, whose stages run on several.")
  if config.boundaries is not None:
    pick_devices(config, len(config.boundaries) + 1)
  elif config.devices is not None:
    pick_devices(config, len(config.devices))


@dataclasses.dataclass(frozen=True)
class Stages:
  """A model's stages, each a chain of layers on its device.

  Attributes:
    layers: Each stage's layers, in order.
    devices: Each stage's device.
  """
  layers: Tuple[Tuple[tf_keras.layers.Layer, ...], ...]
  devices: Tuple[str, ...]

  def __len__(self) -> int:
    return len(self.layers)

  def function(self, index: int) -> Callable[[tf.Tensor], tf.Tensor]:
    """Returns stage `index` as a function of its input, run on its device
    in training mode."""
    layers, device = self.layers[index], self.devices[index]

    def run(inputs):
      # Inside the function, so a recomputation (`tf.recompute_grad`) runs
      # on the stage's device too.
      with tf.device(device):
        outputs = inputs
        for layer in layers:
          outputs = layer(outputs, training=True)
      return outputs

    return run

  def describe(self) -> str:
    """E.g. `conv1..pool on /device:CPU:0 | flatten..logits on ...`."""
    return " | ".join(
        f"{layers[0].name}{'..' + layers[-1].name if len(layers) > 1 else ''}"
        f" on {device}" for layers, device in zip(self.layers, self.devices))


def build(model: tf_keras.Model, config: PipelineConfig,
          build_fn: Callable[[tf_keras.Model], None]
          ) -> Tuple[tf_keras.Model, Stages]:
  """Cuts `model` into stages and places each stage's weights on its device.

  Args:
    model: The Task's model, as `build_model` returned it.
    config: The pipeline settings (enabled).
    build_fn: Builds a model from the input's spec (`trainer.state`'s).

  Returns:
    `(model, stages)`: the model to train (a re-created one for a cut at
    `boundaries`, with the same weights), and its stages.

  Raises:
    errors.ConfigError: For a model that cannot be cut that way, a boundary
      naming no layer, more stages than devices, or a stage with no
      trainable variables.
  """
  if config.task_stages:
    if not isinstance(model, placement.StagedModel):
      raise errors.ConfigError(
          "`pipeline.task_stages` pipelines the stages of a "
          "`placement.StagedModel`; the Task's `build_model` returned a "
          f"{type(model).__name__}: cut it with `pipeline.boundaries`.")
    if model.built:
      raise errors.ConfigError(
          "`pipeline.task_stages`: `build_model` returned a StagedModel "
          "already built, its weights made before their stages' devices "
          "were known: return it unbuilt.")
    found = Stages(tuple(tuple(stage) for stage in model.stages),
                   tuple(pick_devices(config, len(model.stages))))
    # StagedModel makes each stage's weights on `stage_devices`.
    model.stage_devices = list(found.devices)
    build_fn(model)
  else:
    build_fn(model)
    layers = _chain(model)
    cut = _cut(layers, config.boundaries, model.name)
    stage_devices = pick_devices(config, len(cut))
    model = _placed_copy(model, cut, stage_devices)
    by_name = {layer.name: layer for layer in _chain(model)}
    found = Stages(
        tuple(tuple(by_name[layer.name] for layer in stage) for stage in cut),
        tuple(stage_devices))
  _check_stages(found)
  console.info(f"pipeline | {len(found)} stages: {found.describe()}; "
               f"{config.num_microbatches} micro-batch(es)"
               f"{', recomputed' if config.recompute else ''}")
  return model, found


def pick_devices(config: PipelineConfig, num_stages: int) -> List[str]:
  """Returns the device of each of `num_stages` stages.

  `pipeline.devices` if set (the CPU split to have the CPUs they name);
  else the first `num_stages` GPUs; else the host CPU split into
  `num_stages` logical devices (or the first of those it was split into
  already).

  Raises:
    errors.ConfigError: If there are fewer devices than stages, or a named
      device does not exist.
  """
  if config.devices is not None:
    if len(config.devices) < num_stages:
      raise errors.ConfigError(
          f"the pipeline has {num_stages} stages, more than its "
          f"{len(config.devices)} `pipeline.devices`: give each stage a "
          "device, or cut the model into fewer stages.")
    wanted = config.devices[:num_stages]
    cpus = [tf.DeviceSpec.from_string(d) for d in wanted]
    if all(spec.device_type == "CPU" for spec in cpus):
      _split_cpu(max(spec.device_index or 0 for spec in cpus) + 1)
    existing = sorted(placement.short_device(d.name)
                      for d in tf.config.list_logical_devices())
    for device in wanted:
      if placement.short_device(device) not in existing:
        raise errors.ConfigError(
            f"`pipeline.devices` names {device}, which this host does not "
            f"have (it has {', '.join(existing)}).")
    return list(config.devices[:num_stages])
  if tf.config.list_physical_devices("GPU"):
    return devices_lib.first_devices(
        num_stages, "pipeline",
        needs=f"the pipeline's {num_stages} stages")
  _split_cpu(num_stages)
  have = len(tf.config.list_logical_devices("CPU"))
  if have < num_stages:
    # The Task's stages are counted once the model exists, after the inputs
    # started TensorFlow's devices: only named devices are made in time.
    remedy = ("name them in `pipeline.devices`" if config.task_stages else
              "start a new process")
    raise errors.ConfigError(
        f"the pipeline has {num_stages} stages, more than the {have} CPU "
        "device(s) TensorFlow had already made: cut the model into fewer "
        f"stages, or {remedy}.")
  return [f"/device:CPU:{i}" for i in range(num_stages)]


def _split_cpu(count: int) -> None:
  """Splits the host CPU into `count` logical devices unless TensorFlow
  made its devices already (then those it has serve, if enough)."""
  try:
    devices_lib.split_cpu(count, "pipeline")
  except errors.ConfigError:
    pass


def _chain(model: tf_keras.Model) -> List[tf_keras.layers.Layer]:
  """Returns `model`'s layers, which must follow one another.

  Raises:
    errors.ConfigError: If `model` is not a Sequential or a functional
      model of one input and output whose layers each take the previous
      one's output.
  """
  if not getattr(model, "_is_graph_network", False):
    raise errors.ConfigError(
        f"`pipeline.boundaries` cuts a chain of layers; {model.name} is a "
        f"subclassed {type(model).__name__}: build a tf_keras.Sequential "
        "or functional model, or return a `placement.StagedModel` and set "
        "`pipeline.task_stages`.")
  layers = [layer for layer in model.layers
            if not isinstance(layer, tf_keras.layers.InputLayer)]
  previous = model.inputs[0] if len(model.inputs) == 1 else None
  for layer in layers:
    if previous is None or layer.input is not previous:
      raise errors.ConfigError(
          f"`pipeline.boundaries` cuts a chain of layers; in {model.name} "
          f"layer '{layer.name}' does not take the previous layer's output "
          "alone: return a `placement.StagedModel` and set "
          "`pipeline.task_stages`.")
    previous = layer.output
  if len(model.outputs) != 1 or model.outputs[0] is not previous:
    raise errors.ConfigError(
        f"`pipeline.boundaries` cuts a chain of layers; {model.name}'s "
        "output is not its last layer's.")
  return layers


def _cut(layers: Sequence[tf_keras.layers.Layer], boundaries: Sequence[str],
         model_name: str) -> List[List[tf_keras.layers.Layer]]:
  """Cuts `layers` after each layer named in `boundaries`.

  Raises:
    errors.ConfigError: For a name that is no layer, names out of model
      order, or a cut after the last layer.
  """
  names = [layer.name for layer in layers]
  for name in boundaries:
    if name not in names:
      raise errors.ConfigError(
          f"`pipeline.boundaries` names '{name}', which is not a layer of "
          f"{model_name} (its layers: {', '.join(names)}).")
  positions = [names.index(name) for name in boundaries]
  if positions != sorted(positions):
    raise errors.ConfigError(
        f"`pipeline.boundaries` ({', '.join(boundaries)}) must follow the "
        f"model's layer order ({', '.join(names)}).")
  if positions[-1] == len(layers) - 1:
    raise errors.ConfigError(
        f"`pipeline.boundaries` ends a stage at '{boundaries[-1]}', the "
        f"last layer of {model_name}: the stage after it would be empty.")
  starts = [0] + [p + 1 for p in positions] + [len(layers)]
  return [list(layers[a:b]) for a, b in zip(starts, starts[1:])]


def _placed_copy(model: tf_keras.Model,
                 cut: Sequence[Sequence[tf_keras.layers.Layer]],
                 stage_devices: Sequence[str]) -> tf_keras.Model:
  """Re-creates `model` with each layer's weights on its stage's device
  and `model`'s weights copied in.

  Raises:
    errors.ConfigError: For a layer Keras cannot re-create (no
      `get_config`).
  """
  device_of = {layer.name: device
               for stage, device in zip(cut, stage_devices)
               for layer in stage}

  def placed(layer):
    try:
      copy = type(layer).from_config(layer.get_config())
    except NotImplementedError as e:
      raise errors.ConfigError(
          f"`pipeline.boundaries`: layer '{layer.name}' "
          f"({type(layer).__name__}) cannot be re-created on its stage's "
          "device: give it a `get_config`, or return a "
          "`placement.StagedModel` and set `pipeline.task_stages`.") from e
    if isinstance(layer, tf_keras.layers.InputLayer):
      return copy
    spec = layer.input
    with tf.device(device_of[layer.name]):
      # Called once on zeros, its weights are made here, on the device.
      copy(tf.zeros([1] + spec.shape.as_list()[1:], spec.dtype))
    return copy

  copy = tf_keras.models.clone_model(model, clone_function=placed)
  copy.set_weights(model.get_weights())
  return copy


def _check_stages(stages: Stages) -> None:
  """Checks that every stage trains weights, and sits on its device.

  Raises:
    errors.ConfigError: For a stage with no trainable variables, or a
      variable made on another device than its stage's.
  """
  for index, (layers, device) in enumerate(zip(stages.layers,
                                               stages.devices)):
    variables = [v for layer in layers for v in layer.trainable_variables]
    if not variables:
      raise errors.ConfigError(
          f"pipeline stage {index} ({', '.join(l.name for l in layers)}) "
          "has no trainable variables: move a boundary so that every stage "
          "holds weights.")
    wanted = tf.DeviceSpec.from_string(device)
    for variable in variables:
      spec = tf.DeviceSpec.from_string(variable.device)
      if (spec.device_type, spec.device_index) != (wanted.device_type,
                                                   wanted.device_index):
        raise errors.ConfigError(
            f"pipeline stage {index}'s variable {variable.name} was made on "
            f"{placement.short_device(variable.device)}, not {device}: "
            "build the stage's layers inside the stage (unbuilt).")
