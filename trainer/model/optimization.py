"""Optimizers and learning-rate schedules, from gin.

Two small configurables, flat on purpose (one gin line per setting):
`optimizer.*` (which optimizer) and `learning_rate.*` (the schedule and its
warm-up); `ema.*`, the average of the weights, is `trainer.ema`. They are
translated into Model Garden's `OptimizationConfig` and built by its
`OptimizerFactory` (`official.modeling.optimization`), so the optimizers,
schedules and warm-up are Model Garden's own. The factory builds
`tf_keras.optimizers.legacy` optimizers, its default and the only kind its EMA
wraps.

Gradient clipping is not an optimizer setting here: the default training step
clips the gradients it has summed over replicas and micro-batches (see
`trainer.model.gradients`), and reports the norm before clipping.
"""

import dataclasses
import re
from typing import (Any, Dict, Iterator, List, Mapping, Optional, Sequence,
                    Set, Tuple)

import gin
import tensorflow as tf
import tf_keras
from official.modeling.optimization import ema_optimizer
from official.modeling.optimization import optimizer_factory
from official.modeling.optimization.configs import optimization_config

from trainer import checks
from trainer import errors
from trainer.model import optimizer_parts

# Optimizer name -> the settings of `OptimizerConfig` it takes.
OPTIMIZERS: Dict[str, Tuple[str, ...]] = {
    "sgd": ("momentum", "nesterov"),
    "adam": ("beta_1", "beta_2", "epsilon"),
    "adamw": ("beta_1", "beta_2", "epsilon", "weight_decay",
              "exclude_from_weight_decay"),
    "lamb": ("beta_1", "beta_2", "epsilon", "weight_decay",
             "exclude_from_weight_decay"),
    "lars": ("momentum", "nesterov", "weight_decay",
             "exclude_from_weight_decay"),
    "rmsprop": ("momentum", "epsilon"),
    "adagrad": ("epsilon",),
}
SCHEDULES = ("constant", "stepwise", "cosine", "linear", "polynomial",
             "exponential")
# Model Garden's names for what `OptimizerConfig` calls otherwise.
_MODEL_GARDEN_NAMES = {"weight_decay": "weight_decay_rate"}


@gin.configurable("optimizer")
@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """The optimizer, bound as `optimizer.<name>`.

  Settings left None keep the optimizer's own default (Model Garden's); a
  setting the chosen optimizer does not take (see `OPTIMIZERS`) is an error.
  Anything else a Model Garden optimizer accepts goes in `options`.

  Attributes:
    name: One of `OPTIMIZERS`: sgd, adam, adamw (decoupled weight decay),
      lamb, lars, rmsprop, adagrad.
    learning_rate: The peak rate: reached after warm-up, before decay.
    momentum: sgd, lars, rmsprop.
    nesterov: Nesterov momentum; sgd, lars.
    beta_1: adam, adamw, lamb.
    beta_2: adam, adamw, lamb.
    epsilon: adam, adamw, lamb, rmsprop, adagrad.
    weight_decay: Decoupled weight decay rate; adamw, lamb, lars.
    exclude_from_weight_decay: Regular expressions; variables whose name
      matches one are not decayed (e.g. `["bias", "batch_norm"]`).
    options: Further arguments of Model Garden's config for this optimizer,
      e.g. `{"amsgrad": True}`.
  """
  name: str = "adam"
  learning_rate: float = 1e-3
  momentum: Optional[float] = None
  nesterov: Optional[bool] = None
  beta_1: Optional[float] = None
  beta_2: Optional[float] = None
  epsilon: Optional[float] = None
  weight_decay: Optional[float] = None
  exclude_from_weight_decay: Optional[Sequence[str]] = None
  options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    checks.choice("optimizer.name", self.name, OPTIMIZERS)
    checks.number("optimizer.learning_rate", self.learning_rate,
                  above_zero=True)
    for name in ("momentum", "beta_1", "beta_2", "epsilon", "weight_decay"):
      checks.number(f"optimizer.{name}", getattr(self, name), minimum=0,
                    optional=True)
    if self.exclude_from_weight_decay is not None:
      object.__setattr__(self, "exclude_from_weight_decay",
                         tuple(self.exclude_from_weight_decay))
    checks.require(isinstance(self.options, Mapping),
                   f"`optimizer.options` ({self.options!r}) must be a dict.")
    for name in ("momentum", "nesterov", "beta_1", "beta_2", "epsilon",
                 "weight_decay", "exclude_from_weight_decay"):
      checks.require(
          getattr(self, name) is None or name in OPTIMIZERS[self.name],
          f"`optimizer.{name}` does not apply to {self.name!r}, which "
          f"takes: {', '.join(OPTIMIZERS[self.name])}.")


@gin.configurable("learning_rate")
@dataclasses.dataclass(frozen=True)
class ScheduleConfig:
  """The learning-rate schedule, bound as `learning_rate.<name>`.

  The rate climbs linearly from `warmup_learning_rate` to
  `optimizer.learning_rate` over `warmup_steps`, then follows `schedule`.

  Attributes:
    schedule: One of `SCHEDULES`. `constant`; `stepwise` (`values[i]` after
      `boundaries[i-1]`); `cosine` (to `end_learning_rate`); `linear` and
      `polynomial` (to `end_learning_rate` with `power`); `exponential`
      (times `decay_rate` every `decay_steps`).
    decay_steps: Steps the decay lasts, counted after warm-up; None is
      `trainer.train_steps - warmup_steps`.
    boundaries: `stepwise`: the steps at which the rate changes.
    values: `stepwise`: one rate more than `boundaries`; empty divides the
      rate by 10 at each boundary.
    end_learning_rate: `cosine`, `linear`, `polynomial`: the final rate.
    power: `polynomial`: the exponent (1 is linear).
    decay_rate: `exponential`: the factor per `decay_steps`.
    warmup_steps: Steps of linear warm-up; 0 for none.
    warmup_learning_rate: The rate at step 0 when warming up.
    reference_batch_size: If set, every rate above is for this global batch
      and is multiplied by `trainer.global_batch_size / reference_batch_size`
      (the linear scaling rule of Goyal et al., 2017).
  """
  schedule: str = "constant"
  decay_steps: Optional[int] = None
  boundaries: Sequence[int] = ()
  values: Sequence[float] = ()
  end_learning_rate: float = 0.0
  power: float = 1.0
  decay_rate: float = 0.1
  warmup_steps: int = 0
  warmup_learning_rate: float = 0.0
  reference_batch_size: Optional[int] = None

  def __post_init__(self):
    checks.choice("learning_rate.schedule", self.schedule, SCHEDULES)
    object.__setattr__(self, "boundaries", tuple(self.boundaries))
    object.__setattr__(self, "values", tuple(self.values))
    checks.integer("learning_rate.warmup_steps", self.warmup_steps,
                   minimum=0)
    checks.integer("learning_rate.decay_steps", self.decay_steps, minimum=1,
                   optional=True)
    checks.integer("learning_rate.reference_batch_size",
                   self.reference_batch_size, minimum=1, optional=True)
    if self.schedule == "stepwise":
      checks.require(
          bool(self.boundaries) and all(
              checks.is_int(b) and b > 0 for b in self.boundaries) and
          list(self.boundaries) == sorted(set(self.boundaries)),
          f"`learning_rate.boundaries` ({list(self.boundaries)}) must be "
          "increasing positive steps for 'stepwise'.")
      checks.require(
          not self.values or len(self.values) == len(self.boundaries) + 1,
          f"`learning_rate.values` has {len(self.values)} rates; "
          f"'stepwise' with {len(self.boundaries)} boundaries needs "
          f"{len(self.boundaries) + 1}.")
    else:
      checks.require(not self.boundaries and not self.values,
                     "`learning_rate.boundaries` and `values` apply to "
                     f"'stepwise' only, not {self.schedule!r}.")
    if self.schedule == "exponential":
      checks.require(
          checks.is_number(self.decay_rate) and 0 < self.decay_rate <= 1,
          f"`learning_rate.decay_rate` ({self.decay_rate!r}) must be in "
          "(0, 1].")


def learning_rate_factor(schedule: ScheduleConfig,
                         global_batch_size: int) -> Optional[float]:
  """Returns the batch-size factor of `reference_batch_size`, or None."""
  if schedule.reference_batch_size is None:
    return None
  return global_batch_size / schedule.reference_batch_size


def _optimizer_settings(optimizer: OptimizerConfig) -> Dict[str, Any]:
  """The optimizer's settings under Model Garden's names."""
  settings = {_MODEL_GARDEN_NAMES.get(name, name): getattr(optimizer, name)
              for name in OPTIMIZERS[optimizer.name]
              if getattr(optimizer, name) is not None}
  if "exclude_from_weight_decay" in settings:
    settings["exclude_from_weight_decay"] = list(
        settings["exclude_from_weight_decay"])
  if optimizer.name == "adamw":
    settings["gradient_clip_norm"] = 0.0  # The training step clips.
  settings.update(optimizer.options)
  return settings


def _rate_params(schedule: ScheduleConfig, peak: float,
                 train_steps: int) -> Dict[str, Any]:
  """The schedule's parameters under Model Garden's names, from `peak`.

  Raises:
    errors.ConfigError: If the warm-up leaves no step to decay.
  """
  warmup = schedule.warmup_steps
  decay_steps = schedule.decay_steps or train_steps - warmup
  if schedule.schedule not in ("constant", "stepwise"):
    checks.require(
        decay_steps > 0,
        f"`learning_rate.warmup_steps` ({warmup}) leaves no step to decay "
        f"in `trainer.train_steps` ({train_steps}).")
  end = schedule.end_learning_rate
  return {
      "constant": lambda: {"learning_rate": peak},
      "stepwise": lambda: {
          "boundaries": list(schedule.boundaries),
          "values": (list(schedule.values) or
                     [peak * 0.1**i
                      for i in range(len(schedule.boundaries) + 1)])},
      # Decays start after the warm-up (`offset`), so the peak is reached.
      "cosine": lambda: {"initial_learning_rate": peak,
                         "decay_steps": decay_steps, "alpha": end / peak,
                         "offset": warmup},
      "linear": lambda: {"initial_learning_rate": peak,
                         "decay_steps": decay_steps,
                         "end_learning_rate": end, "power": 1.0,
                         "offset": warmup},
      "polynomial": lambda: {"initial_learning_rate": peak,
                             "decay_steps": decay_steps,
                             "end_learning_rate": end,
                             "power": schedule.power, "offset": warmup},
      "exponential": lambda: {"initial_learning_rate": peak,
                              "decay_steps": decay_steps,
                              "decay_rate": schedule.decay_rate,
                              "offset": warmup},
  }[schedule.schedule]()


def optimization_params(optimizer: OptimizerConfig, schedule: ScheduleConfig,
                        train_steps: int) -> Dict[str, Any]:
  """Returns Model Garden's `OptimizationConfig` parameters for our configs.

  Args:
    optimizer: Which optimizer.
    schedule: Which schedule.
    train_steps: The run's last step; the default decay length ends there.

  Raises:
    errors.ConfigError: If the schedule does not fit in `train_steps`.
  """
  settings = _optimizer_settings(optimizer)
  rate = _rate_params(schedule, optimizer.learning_rate, train_steps)
  rate_type = {"linear": "polynomial"}.get(schedule.schedule,
                                           schedule.schedule)
  params = {
      "optimizer": {"type": optimizer.name, optimizer.name: settings},
      "learning_rate": {"type": rate_type, rate_type: rate},
  }
  if schedule.warmup_steps:
    params["warmup"] = {"type": "linear", "linear": {
        "warmup_steps": schedule.warmup_steps,
        "warmup_learning_rate": schedule.warmup_learning_rate}}
  return params


def build_optimizer(optimizer: OptimizerConfig, schedule: ScheduleConfig,
                    train_steps: int) -> tf_keras.optimizers.legacy.Optimizer:
  """Builds the optimizer and schedule with Model Garden's factory.

  Call it inside the strategy scope.

  Raises:
    errors.ConfigError: For settings Model Garden rejects (an unknown key of
      `optimizer.options`, say).
  """
  params = optimization_params(optimizer, schedule, train_steps)
  try:
    config = optimization_config.OptimizationConfig(params)
    factory = optimizer_factory.OptimizerFactory(config)
    return factory.build_optimizer(factory.build_learning_rate())
  except (KeyError, TypeError, ValueError, AttributeError) as e:
    raise errors.ConfigError(
        f"Model Garden cannot build optimizer {optimizer.name!r} with "
        f"{params['optimizer'][optimizer.name]}: "
        f"{str(e).strip().splitlines()[0]}") from e


@dataclasses.dataclass(frozen=True)
class Settings:
  """What `Task.create_optimizer` builds by default.

  Attributes:
    optimizer: Gin's `optimizer.*`.
    schedule: Gin's `learning_rate.*`.
    train_steps: The run's last step, where decays end by default.
    name: The model (or part) the optimizer is for, where a Task has
      several; its gin scope gave `optimizer` and `schedule`.
  """
  optimizer: OptimizerConfig
  schedule: ScheduleConfig
  train_steps: int
  name: str = ""

  @classmethod
  def scoped(cls, name: str, train_steps: int) -> "Settings":
    """The settings gin binds under the scope `name` (over the unscoped
    ones): `name/optimizer.*`, `name/learning_rate.*`."""
    try:
      with gin.config_scope(name):
        return cls(OptimizerConfig(), ScheduleConfig(), train_steps, name)
    except errors.ConfigError as e:
      raise errors.ConfigError(_scoped_message(name, e)) from None

  def build(self) -> tf_keras.optimizers.legacy.Optimizer:
    """Builds the optimizer with its schedule; call inside the scope."""
    return build_optimizer(self.optimizer, self.schedule, self.train_steps)


def _scoped_message(scope: str, error: errors.ConfigError) -> str:
  """`error`'s line, naming the setting as bound: `generator/optimizer.name`
  where the scope binds it. (Gin appends an "In call to configurable ...
  in scope" line, which is dropped.)"""
  line = str(error).splitlines()[0]
  found = re.match(r"`(optimizer|learning_rate)\.(\w+)`", line)
  if found and found.group(2) in scoped_bindings(scope, found.group(1)):
    line = f"`{scope}/{line[1:]}"
  return line


def wrappers(optimizer: Optional[tf_keras.optimizers.Optimizer]
              ) -> Iterator[tf_keras.optimizers.Optimizer]:
  """Yields `optimizer`, then each optimizer it wraps, outermost first: a
  loss-scale optimizer's `inner_optimizer`, an EMA's averaged optimizer."""
  while optimizer is not None:
    yield optimizer
    inner = getattr(optimizer, "inner_optimizer", None)
    if inner is None and isinstance(optimizer,
                                    ema_optimizer.ExponentialMovingAverage):
      inner = optimizer._optimizer  # pylint: disable=protected-access
    optimizer = inner


def unwrap(optimizer: tf_keras.optimizers.Optimizer
           ) -> tf_keras.optimizers.Optimizer:
  """Returns the optimizer that owns the learning rate, inside any wrapper."""
  *_, innermost = wrappers(optimizer)
  return innermost


# What gin binds per model or part. (gin has no public way to list scoped
# bindings; `_CONFIG` maps (scope, selector) to the bound parameters.)
SCOPED_CONFIGURABLES = ("optimizer", "learning_rate", "trainer")


def _selector(configurable: str) -> str:
  return gin.config._REGISTRY.get_match(configurable).selector  # pylint: disable=protected-access


def scoped_binding_names() -> Set[str]:
  """The gin scopes under which `optimizer.*`, `learning_rate.*` or
  `trainer.*` are bound (gin accepts any scope name, so a misspelt one
  would silently be ignored)."""
  selectors = {_selector(name) for name in SCOPED_CONFIGURABLES}
  return {scope for scope, selector in gin.config._CONFIG  # pylint: disable=protected-access
          if scope and selector in selectors}


def scoped_bindings(scope: str, configurable: str) -> Dict[str, Any]:
  """The parameters gin binds for `configurable` under `scope` alone."""
  return dict(gin.config._CONFIG.get((scope, _selector(configurable)), {}))  # pylint: disable=protected-access


def parts(optimizer: Optional[tf_keras.optimizers.Optimizer]
          ) -> Dict[str, tf_keras.optimizers.Optimizer]:
  """The per-part optimizers inside `optimizer` (`trainer.optimizer_parts`),
  by part name; {} for one optimizer."""
  inner = unwrap(optimizer) if optimizer is not None else None
  if isinstance(inner, optimizer_parts.PartitionedOptimizer):
    return inner.parts
  return {}


def get_learning_rate(optimizer: tf_keras.optimizers.Optimizer):
  """Returns the learning rate as set: a schedule, a number or a variable;
  per-part optimizers answer with their first part's.

  The public getter of the newer tf_keras optimizers evaluates a schedule
  instead of returning it.
  """
  inner = unwrap(optimizer)
  if isinstance(inner, optimizer_parts.PartitionedOptimizer):
    inner = unwrap(next(iter(inner.parts.values())))
  if isinstance(inner, tf_keras.optimizers.legacy.Optimizer):
    return inner._get_hyper("learning_rate")  # pylint: disable=protected-access
  return inner._learning_rate  # pylint: disable=protected-access


def set_learning_rate(optimizer: tf_keras.optimizers.Optimizer,
                      rate) -> None:
  """Replaces the learning rate (a schedule or a number) of `optimizer`."""
  unwrap(optimizer).learning_rate = rate


def current_learning_rate(optimizer: tf_keras.optimizers.Optimizer
                          ) -> tf.Tensor:
  """Returns the float32 learning rate at the optimizer's current step; also
  inside a `tf.function`."""
  rate = get_learning_rate(optimizer)
  if isinstance(rate, tf_keras.optimizers.schedules.LearningRateSchedule):
    rate = rate(unwrap(optimizer).iterations)  # Per-part: the first's.
  return tf.cast(tf.convert_to_tensor(rate), tf.float32)


def create_slots(optimizer: tf_keras.optimizers.Optimizer,
                 variables: List[tf.Variable]) -> None:
  """Creates the optimizer's slots for `variables` now, in the scope, rather
  than at the first `apply_gradients`."""
  inner = next(wrapper for wrapper in wrappers(optimizer) if not isinstance(
      wrapper, tf_keras.mixed_precision.LossScaleOptimizer))
  if isinstance(inner, tf_keras.optimizers.legacy.Optimizer):
    inner._create_all_weights(variables)  # pylint: disable=protected-access
  else:
    inner.build(variables)


def optimizer_variables(optimizer: tf_keras.optimizers.Optimizer
                        ) -> List[tf.Variable]:
  """Returns the optimizer's variables, slots and EMA averages included.

  Legacy optimizers list slots in `weights` and EMA averages in
  `variables()`; a loss-scale or EMA wrapper answers for what it wraps.
  """
  found = {}
  for attribute in ("weights", "variables"):
    value = getattr(optimizer, attribute, None)
    for variable in (value() if callable(value) else value) or []:
      found[id(variable)] = variable
  return list(found.values())
