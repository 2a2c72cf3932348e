"""The training state: the model, the optimizer and the global step.

`build` makes them in the strategy scope, the model built from the input's
spec so a checkpoint restores at once, the optimizer with its learning-rate
scaling, weight averages (EMA) and float16 loss scaling. `TrainState` is
what checkpoints hold (`trainer.build.checkpoint_items`) and what is
evaluated, exported and fingerprinted.
"""

import dataclasses
import hashlib
from typing import (Callable, ContextManager, Dict, List, Optional, Tuple,
                    Union)

import orbit
import tensorflow as tf
import tf_keras

from trainer import checks
from trainer import config as config_lib
from trainer import console
from trainer import errors
from trainer import runtime as runtime_lib
from trainer.distribute import pipeline
from trainer.distribute import placement
from trainer.model import ema
from trainer.model import gradients
from trainer.model import hyperparameters as hyperparameters_lib
from trainer.model import named
from trainer.model import optimization
from trainer.model import optimizer_parts
from trainer.model import precision
from trainer.model import scaling
from trainer.model import task as task_lib


@dataclasses.dataclass
class TrainState:
  """What is trained, saved and evaluated.

  Attributes:
    model: The model, or the models by name (`trainer.model.named`).
    optimizer: The optimizer, or the optimizers by model name; None in eval
      modes without EMA.
    global_step: The global step.
    strategy: The strategy the variables were made in.
    stages: The model's pipeline stages (`pipeline.*`); None unpipelined.
    hyperparameters: The optimizers' hyperparameters as configured, put
      back over a restored checkpoint's (`hyperparameters.assign`).
  """
  model: Union[tf_keras.Model, Dict[str, tf_keras.Model]]
  optimizer: Union[None, tf_keras.optimizers.Optimizer,
                   Dict[str, tf_keras.optimizers.Optimizer]]
  global_step: tf.Variable
  strategy: tf.distribute.Strategy
  stages: Optional[pipeline.Stages] = None
  hyperparameters: hyperparameters_lib.Configured = (
      hyperparameters_lib.Configured())

  def assign_hyperparameters(self) -> List[Tuple[str, float, float]]:
    """Puts the configured hyperparameters over a restored checkpoint's
    (`hyperparameters.assign`); returns those it replaced."""
    with self.strategy.scope():
      return hyperparameters_lib.assign(self.hyperparameters)

  def step(self) -> int:
    """The global step, read from the device."""
    return int(self.global_step.numpy())

  def averaged_weights(self) -> ContextManager:
    """A context in which the (`ema.model`) model holds its EMA weights, if
    any."""
    averaged = next((optimizer for optimizer in
                     named.named(self.optimizer).values()
                     if ema.find(optimizer) is not None), None)
    return ema.averaged_weights(averaged, self.strategy)

  def all_finite(self) -> bool:
    """Whether every model and optimizer variable is finite (one read)."""
    variables = named.variables(self.model) + [
        v for optimizer in named.named(self.optimizer).values()
        for v in optimization.optimizer_variables(optimizer)]
    checks = [tf.reduce_all(tf.math.is_finite(v)) for v in variables
              if v.dtype.is_floating]
    return bool(tf.reduce_all(checks).numpy()) if checks else True


def build(task: task_lib.Task, strategy: tf.distribute.Strategy,
          element_spec, config: config_lib.TrainerConfig,
          runtime: runtime_lib.RuntimeConfig, *, training: bool,
          replica_factor: float = 1.0,
          optimizer_fn: Optional[
              Callable[[], tf_keras.optimizers.Optimizer]] = None
          ) -> TrainState:
  """Builds the state in the strategy scope.

  Args:
    task: Builds the model and the optimizer.
    strategy: Where the variables live.
    element_spec: The input's batched `(features, labels)` spec.
    config: The loop settings (optimizer, EMA, rollback).
    runtime: The precision and the model's devices.
    training: Whether the state is trained (it needs an optimizer).
    replica_factor: The learning-rate factor of `trainer.batch_scaling`.
    optimizer_fn: Makes the optimizer of each trained model in place of
      the task's, unscaled, unaveraged and not loss-scaled (`check_task`'s
      plain SGD); None for the task's.
  """
  pipeline.set_up(config.pipeline, runtime)
  model_devices = placement.configure(runtime.model_parallel_devices)
  with strategy.scope(), placement.building(model_devices):
    model = task.build_model()
    named.check_models(type(task).__name__, model)
    stages = None
    if config.pipeline.enabled:
      model, stages = _pipelined(type(task).__name__, model, element_spec,
                                 config.pipeline)
    for name, each in named.named(model).items():
      ensure_built(each, element_spec, name)
    global_step = orbit.utils.create_global_step()
    optimizer = None
    if optimizer_fn is not None:
      optimizer = ({name: optimizer_fn() for name in named.trainable(model)}
                   if named.several(model) else optimizer_fn())
    elif training or config.ema.enabled:
      # Evaluation builds it too with EMA: the averages are its slots.
      optimizer = (
          _build_several(task, model, config, runtime, replica_factor)
          if named.several(model) else
          build_optimizer(task, model, config, runtime, replica_factor))
    if training and config.on_nonfinite == "rollback":
      # A rollback may go back to a checkpoint saved before the first step;
      # it must hold the optimizer slots too, or they would keep the
      # non-finite values.
      models = named.named(model)
      for name, each in named.named(optimizer).items():
        optimization.create_slots(each, models[name].trainable_variables)
  # Read before any restore puts a checkpoint's values over them.
  configured = hyperparameters_lib.configured(optimizer)
  return TrainState(model, optimizer, global_step, strategy, stages,
                    configured)


def _pipelined(task_name: str, model, element_spec,
               config: pipeline.PipelineConfig
               ) -> Tuple[tf_keras.Model, pipeline.Stages]:
  """Cuts the task's model into its pipeline stages, built on their
  devices (`trainer.distribute.pipeline.build`).

  Raises:
    errors.ConfigError: For several models, and see `pipeline.build`.
  """
  if named.several(model):
    raise errors.ConfigError(
        f"{task_name} builds several models ({', '.join(model)}); a "
        "pipeline (`pipeline.boundaries`/`task_stages`) cuts one.")
  return pipeline.build(model, config,
                        lambda each: ensure_built(each, element_spec))


def ensure_built(model: tf_keras.Model, element_spec, name: str = "") -> None:
  """Builds `model` from the input spec so checkpoints restore at once.

  Raises:
    errors.ConfigError: If the model declares inputs one rank lower than
      the batched features: the examples were batched already; or if one
      of several models (`name`) is not built: the input's features need
      not be its inputs.
  """
  if model.built:
    if not name:
      check_input_ranks(model, element_spec[0])
    return
  if name:
    raise errors.ConfigError(
        f"model '{name}' is not built: with several models, give each an "
        "input shape (`tf_keras.Input`) or call it once in `build_model`.")
  features_spec = element_spec[0]
  dummy = tf.nest.map_structure(
      lambda spec: tf.zeros([1] + spec.shape.as_list()[1:], spec.dtype),
      features_spec)
  model(dummy, training=False)


def check_input_ranks(model: tf_keras.Model, features_spec) -> None:
  """Raises if batched features have one rank more than the model's inputs
  (`build_inputs` batched with a fixed size, `batch(n, drop_remainder=True)`).

  Raises:
    errors.ConfigError: Naming `build_inputs`.
  """
  inputs = getattr(model, "inputs", None) or []
  specs = tf.nest.flatten(features_spec)
  if len(inputs) != len(specs):
    return
  for model_input, spec in zip(inputs, specs):
    if (model_input.shape.rank is not None and spec.shape.rank is not None
        and spec.shape.rank == model_input.shape.rank + 1):
      raise errors.ConfigError(
          f"`build_inputs` returns batched data: the model takes inputs of "
          f"shape {model_input.shape} but each example has shape "
          f"{spec.shape[1:]}: return single examples and let the framework "
          "batch them (remove `.batch(...)`).")


def build_optimizer(task: task_lib.Task, model: tf_keras.Model,
                    config: config_lib.TrainerConfig,
                    runtime: runtime_lib.RuntimeConfig,
                    replica_factor: float) -> tf_keras.optimizers.Optimizer:
  """Builds the task's optimizer, scaled, averaged and loss-scaled.

  Call inside the strategy scope.

  Args:
    task: Creates the optimizer.
    model: The model (EMA averages its weights).
    config: The optimizer, schedule, EMA and batch settings.
    runtime: The precision (float16 adds loss scaling).
    replica_factor: The learning-rate factor of `trainer.batch_scaling`.
  """
  named.check_choice("ema.model", config.ema.model, model)
  named.check_scopes(optimization.scoped_binding_names(),
                     config.optimizer_parts or (), "optimizer part")
  if config.optimizer_parts:
    optimizer = _build_parts(task, model, config, replica_factor)
  else:
    optimizer = _build_scaled(
        task, optimization.Settings(config.optimizer, config.learning_rate,
                                    config.train_steps),
        config, replica_factor)
  optimizer = ema.add(optimizer, model, config.ema)
  return precision.wrap_optimizer(optimizer, runtime)


def _build_scaled(task: task_lib.Task, settings: optimization.Settings,
                  config: config_lib.TrainerConfig, replica_factor: float,
                  multiplier: float = 1.0,
                  part: str = "") -> tf_keras.optimizers.Optimizer:
  """Builds the task's optimizer from `settings`, its learning rate scaled
  for the batch (or the replicas) and by `multiplier`."""
  optimizer = task.create_optimizer(settings)
  batch_factor = optimization.learning_rate_factor(settings.schedule,
                                                   config.global_batch_size)
  factor = replica_factor if batch_factor is None else batch_factor
  scaling.scale_learning_rate(optimizer, factor * multiplier)
  if batch_factor is not None and batch_factor != 1.0:
    console.info(f"learning rate | {part + ': ' if part else ''}"
                 f"x{batch_factor:g} for global batch "
                 f"{config.global_batch_size} (rates are written for "
                 f"{settings.schedule.reference_batch_size})")
  return optimizer


def _build_parts(task: task_lib.Task, model: tf_keras.Model,
                 config: config_lib.TrainerConfig, replica_factor: float
                 ) -> optimizer_parts.PartitionedOptimizer:
  """Builds one optimizer per part of `trainer.optimizer_parts`, each from
  the gin bindings under its part's scope, and says what each part got.

  Raises:
    errors.ConfigError: See `optimizer_parts.assign`.
  """
  owned = optimizer_parts.assign(config.optimizer_parts,
                                 model.trainable_variables)
  multipliers = config.learning_rate_multipliers or {}
  built = {}
  for part in config.optimizer_parts:
    built[part] = _build_scaled(
        task, optimization.Settings.scoped(part, config.train_steps), config,
        replica_factor, multipliers.get(part, 1.0), part)
    scaled = f" (x{multipliers[part]:g})" if part in multipliers else ""
    console.info(f"optimizer | part {part}: {named.describe(owned[part])}, "
                 f"{_describe(built[part])}{scaled}")
  return optimizer_parts.PartitionedOptimizer(built, owned)


def _describe(optimizer: tf_keras.optimizers.Optimizer) -> str:
  """E.g. `Adam, rate 0.001` or `SGD, a schedule`."""
  rate = optimization.get_learning_rate(optimizer)
  rate = ("a schedule" if isinstance(
      rate, tf_keras.optimizers.schedules.LearningRateSchedule)
          else f"rate {float(tf.convert_to_tensor(rate)):g}")
  return f"{type(optimization.unwrap(optimizer)).__name__}, {rate}"


def _build_several(task: task_lib.Task, models: Dict[str, tf_keras.Model],
                   config: config_lib.TrainerConfig,
                   runtime: runtime_lib.RuntimeConfig, replica_factor: float
                   ) -> Dict[str, tf_keras.optimizers.Optimizer]:
  """Builds one optimizer per trainable model of a Task with several, each
  from the gin bindings under the model's name, scaled, averaged (the
  `ema.model`) and loss-scaled.

  Raises:
    errors.ConfigError: For per-part optimizers (each model has its own),
      a gin scope or `ema.model` naming no model.
  """
  if config.optimizer_parts:
    raise errors.ConfigError(
        "`trainer.optimizer_parts` splits one model's variables; a Task with "
        "several models gives each its own optimizer (bound under its "
        "name: `generator/optimizer.*`).")
  trainable = named.trainable(models)
  named.check_scopes(optimization.scoped_binding_names(), trainable,
                     "trained model")
  if config.ema.enabled:
    named.check_choice("ema.model", config.ema.model, models)
  optimizers = {}
  for name, model in trainable.items():
    optimizer = _build_scaled(
        task, optimization.Settings.scoped(name, config.train_steps), config,
        replica_factor, part=name)
    console.info(f"optimizer | {name}: "
                 f"{named.describe(model.trainable_variables)}, "
                 f"{_describe(optimizer)}")
    if config.ema.model == name:
      optimizer = ema.add(optimizer, model, config.ema)
    optimizers[name] = precision.wrap_optimizer(optimizer, runtime)
  return optimizers


def scoped_clipping(name: str, config: config_lib.TrainerConfig
                     ) -> gradients.StepOptions:
  """The clipping of model `name`'s gradients: `trainer.gradient_clip_*`
  bound under its name (`discriminator/trainer.gradient_clip_norm`), else
  the run's.

  Raises:
    errors.ConfigError: For a bad value, or a micro-batch count bound under
      a model's name (micro-batches cut the step's batch, for every model).
  """
  bound = optimization.scoped_bindings(name, "trainer")
  if "gradient_accumulation_steps" in bound:
    raise errors.ConfigError(
        f"`{name}/trainer.gradient_accumulation_steps`: micro-batches cut "
        "the step's batch for every model at once; bind "
        "`trainer.gradient_accumulation_steps` without a model's name.")
  values = {}
  for field in ("gradient_clip_norm", "gradient_clip_value"):
    values[field] = bound.get(field, getattr(config, field))
    checks.number(f"{name}/trainer.{field}", values[field], above_zero=True,
                  optional=True)
  return gradients.StepOptions(clip_norm=values["gradient_clip_norm"],
                               clip_value=values["gradient_clip_value"])


def loss_scale_scalars(optimizer) -> Dict[str, float]:
  """Returns each float16 loss scale as a scalar: `loss_scale`, or
  `loss_scale/<model>` with several models."""
  return {("loss_scale/" + name if name else "loss_scale"):
          float(each.loss_scale)
          for name, each in named.named(optimizer).items()
          if isinstance(each, tf_keras.mixed_precision.LossScaleOptimizer)}


def weights_fingerprint(model) -> str:
  """Returns a short hash of every weight's bytes, in `model.weights` order
  (of every model, in name order, with several).

  Equal fingerprints mean bit-identical weights: compare them across
  workers, replicas or reruns.
  """
  digest = hashlib.sha256()
  for weight in named.weights(model):
    digest.update(weight.numpy().tobytes())
  return digest.hexdigest()[:16]
