"""Optimizers, learning-rate schedules and weight averaging, from gin.

Three small configurables, flat on purpose (one gin line per setting):
`optimizer.*` (which optimizer), `learning_rate.*` (the schedule and its
warm-up) and `ema.*` (an exponential moving average of the weights). They are
translated into Model Garden's `OptimizationConfig` and built by its
`OptimizerFactory` (`official.modeling.optimization`), so the optimizers,
schedules, warm-up and EMA are Model Garden's own. The factory builds
`tf_keras.optimizers.legacy` optimizers, its default and the only kind its EMA
wraps.

Gradient clipping is not an optimizer setting here: the default training step
clips the gradients it has summed over replicas and micro-batches (see
`trainer.gradients`), and reports the norm before clipping.
"""

import contextlib
import dataclasses
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import gin
import tensorflow as tf
import tf_keras
from official.modeling.optimization import ema_optimizer
from official.modeling.optimization import optimizer_factory
from official.modeling.optimization.configs import optimization_config

from trainer import errors

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


def _check(condition: bool, message: str) -> None:
  if not condition:
    raise errors.ConfigError(message)


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
    _check(self.name in OPTIMIZERS,
           f"`optimizer.name` ({self.name!r}) must be one of: "
           f"{', '.join(OPTIMIZERS)}.")
    _check(_is_number(self.learning_rate) and self.learning_rate > 0,
           f"`optimizer.learning_rate` ({self.learning_rate!r}) must be a "
           "positive number.")
    for name in ("momentum", "beta_1", "beta_2", "epsilon", "weight_decay"):
      value = getattr(self, name)
      _check(value is None or (_is_number(value) and value >= 0),
             f"`optimizer.{name}` ({value!r}) must be a number >= 0, or "
             "None.")
    if self.exclude_from_weight_decay is not None:
      object.__setattr__(self, "exclude_from_weight_decay",
                         tuple(self.exclude_from_weight_decay))
    _check(isinstance(self.options, Mapping),
           f"`optimizer.options` ({self.options!r}) must be a dict.")
    for name in ("momentum", "nesterov", "beta_1", "beta_2", "epsilon",
                 "weight_decay", "exclude_from_weight_decay"):
      if getattr(self, name) is not None and name not in OPTIMIZERS[self.name]:
        raise errors.ConfigError(
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
    _check(self.schedule in SCHEDULES,
           f"`learning_rate.schedule` ({self.schedule!r}) must be one of: "
           f"{', '.join(SCHEDULES)}.")
    object.__setattr__(self, "boundaries", tuple(self.boundaries))
    object.__setattr__(self, "values", tuple(self.values))
    _check(_is_int(self.warmup_steps) and self.warmup_steps >= 0,
           f"`learning_rate.warmup_steps` ({self.warmup_steps!r}) must be an "
           "integer >= 0.")
    _check(self.decay_steps is None or (_is_int(self.decay_steps) and
                                        self.decay_steps > 0),
           f"`learning_rate.decay_steps` ({self.decay_steps!r}) must be a "
           "positive integer or None.")
    _check(self.reference_batch_size is None or (
        _is_int(self.reference_batch_size) and self.reference_batch_size > 0),
           "`learning_rate.reference_batch_size` "
           f"({self.reference_batch_size!r}) must be a positive integer or "
           "None.")
    if self.schedule == "stepwise":
      _check(bool(self.boundaries) and all(
          _is_int(b) and b > 0 for b in self.boundaries) and list(
              self.boundaries) == sorted(set(self.boundaries)),
             f"`learning_rate.boundaries` ({list(self.boundaries)}) must be "
             "increasing positive steps for 'stepwise'.")
      _check(not self.values or
             len(self.values) == len(self.boundaries) + 1,
             f"`learning_rate.values` has {len(self.values)} rates; "
             f"'stepwise' with {len(self.boundaries)} boundaries needs "
             f"{len(self.boundaries) + 1}.")
    else:
      _check(not self.boundaries and not self.values,
             "`learning_rate.boundaries` and `values` apply to 'stepwise' "
             f"only, not {self.schedule!r}.")
    if self.schedule == "exponential":
      _check(_is_number(self.decay_rate) and 0 < self.decay_rate <= 1,
             f"`learning_rate.decay_rate` ({self.decay_rate!r}) must be in "
             "(0, 1].")


@gin.configurable("ema")
@dataclasses.dataclass(frozen=True)
class EmaConfig:
  """An exponential moving average of the weights, bound as `ema.<name>`.

  When `decay` is set, evaluations, the best checkpoint and SavedModel
  exports use the averaged weights; checkpoints hold both.

  Attributes:
    decay: The averaging decay (e.g. 0.999); None turns EMA off.
    start_step: Averaging starts at this step (the average follows the
      weights before it).
    dynamic_decay: Ramp the decay up as `min(decay, (1 + t) / (10 + t))`,
      `t` the steps since `start_step` (as `tf.train.ExponentialMovingAverage`
      with `num_updates`).
    trainable_weights_only: Average only trainable weights; False averages
      every weight (batch-norm statistics too).
  """
  decay: Optional[float] = None
  start_step: int = 0
  dynamic_decay: bool = True
  trainable_weights_only: bool = True

  def __post_init__(self):
    _check(self.decay is None or (_is_number(self.decay) and
                                  0 < self.decay < 1),
           f"`ema.decay` ({self.decay!r}) must be in (0, 1), or None.")
    _check(_is_int(self.start_step) and self.start_step >= 0,
           f"`ema.start_step` ({self.start_step!r}) must be an integer >= 0.")

  @property
  def enabled(self) -> bool:
    return self.decay is not None


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def learning_rate_factor(schedule: ScheduleConfig,
                         global_batch_size: int) -> Optional[float]:
  """Returns the batch-size factor of `reference_batch_size`, or None."""
  if schedule.reference_batch_size is None:
    return None
  return global_batch_size / schedule.reference_batch_size


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
  peak = optimizer.learning_rate
  settings = {_MODEL_GARDEN_NAMES.get(name, name): getattr(optimizer, name)
              for name in OPTIMIZERS[optimizer.name]
              if getattr(optimizer, name) is not None}
  if "exclude_from_weight_decay" in settings:
    settings["exclude_from_weight_decay"] = list(
        settings["exclude_from_weight_decay"])
  if optimizer.name == "adamw":
    settings["gradient_clip_norm"] = 0.0  # The training step clips.
  settings.update(optimizer.options)

  warmup = schedule.warmup_steps
  decay_steps = schedule.decay_steps or train_steps - warmup
  if schedule.schedule not in ("constant", "stepwise"):
    _check(decay_steps > 0,
           f"`learning_rate.warmup_steps` ({warmup}) leaves no step to decay "
           f"in `trainer.train_steps` ({train_steps}).")
  end = schedule.end_learning_rate
  rate = {
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
  rate_type = {"linear": "polynomial"}.get(schedule.schedule,
                                           schedule.schedule)
  params = {
      "optimizer": {"type": optimizer.name, optimizer.name: settings},
      "learning_rate": {"type": rate_type, rate_type: rate},
  }
  if warmup:
    params["warmup"] = {"type": "linear", "linear": {
        "warmup_steps": warmup,
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
  """
  optimizer: OptimizerConfig
  schedule: ScheduleConfig
  train_steps: int

  def build(self) -> tf_keras.optimizers.legacy.Optimizer:
    """Builds the optimizer with its schedule; call inside the scope."""
    return build_optimizer(self.optimizer, self.schedule, self.train_steps)


class ExponentialMovingAverage(ema_optimizer.ExponentialMovingAverage):
  """Model Garden's EMA optimizer, passing on how gradients are aggregated.

  Model Garden's `apply_gradients` drops `experimental_aggregate_gradients`:
  gradients the training step already summed over replicas would be summed
  again, and a `LossScaleOptimizer` around it (float16), which always
  passes the argument, fails with a TypeError.
  """

  def apply_gradients(self, grads_and_vars, name: Optional[str] = None,
                      experimental_aggregate_gradients: bool = True):
    result = self._optimizer.apply_gradients(
        grads_and_vars, name,
        experimental_aggregate_gradients=experimental_aggregate_gradients)
    ema_optimizer.maybe_merge_call(self.update_average,
                                   tf.distribute.get_strategy())
    return result


def add_ema(optimizer: tf_keras.optimizers.Optimizer, model: tf_keras.Model,
            config: EmaConfig) -> tf_keras.optimizers.Optimizer:
  """Wraps `optimizer` to average `model`'s weights; call in the scope.

  Raises:
    errors.ConfigError: If `optimizer` is not a legacy tf_keras optimizer,
      the only kind Model Garden's EMA wraps.
  """
  if not config.enabled:
    return optimizer
  if not isinstance(optimizer, tf_keras.optimizers.legacy.Optimizer):
    raise errors.ConfigError(
        "`ema.decay` needs a `tf_keras.optimizers.legacy` optimizer (Model "
        f"Garden's EMA wraps no other); the task's is "
        f"{type(optimizer).__name__}.")
  ema = ExponentialMovingAverage(
      optimizer, trainable_weights_only=config.trainable_weights_only,
      average_decay=config.decay, start_step=config.start_step,
      dynamic_decay=config.dynamic_decay)
  ema.shadow_copy(model)
  return ema


def _wrappers(optimizer: Optional[tf_keras.optimizers.Optimizer]
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


def find_ema(optimizer: Optional[tf_keras.optimizers.Optimizer]
             ) -> Optional[ExponentialMovingAverage]:
  """Returns the EMA optimizer inside `optimizer` (or itself), or None."""
  return next((wrapper for wrapper in _wrappers(optimizer) if isinstance(
      wrapper, ema_optimizer.ExponentialMovingAverage)), None)


@contextlib.contextmanager
def averaged_weights(optimizer: Optional[tf_keras.optimizers.Optimizer],
                     strategy: tf.distribute.Strategy) -> Iterator[bool]:
  """Puts the EMA weights into the model for the `with` block, if any.

  Yields:
    Whether the model holds averaged weights inside the block.
  """
  ema = find_ema(optimizer)
  if ema is None:
    yield False
    return
  _swap(ema, strategy)
  try:
    yield True
  finally:
    _swap(ema, strategy)


def _swap(ema: ExponentialMovingAverage,
          strategy: tf.distribute.Strategy) -> None:
  with strategy.scope():
    if tf.distribute.in_cross_replica_context():
      ema.swap_weights()
    else:
      # TensorFlow's default strategy has no cross-replica context, which
      # Model Garden's `swap_weights` demands; the swap it runs works there.
      ema._swap_weights()  # pylint: disable=protected-access


def unwrap(optimizer: tf_keras.optimizers.Optimizer
           ) -> tf_keras.optimizers.Optimizer:
  """Returns the optimizer that owns the learning rate, inside any wrapper."""
  *_, innermost = _wrappers(optimizer)
  return innermost


def get_learning_rate(optimizer: tf_keras.optimizers.Optimizer):
  """Returns the learning rate as set: a schedule, a number or a variable.

  The public getter of the newer tf_keras optimizers evaluates a schedule
  instead of returning it.
  """
  inner = unwrap(optimizer)
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
    rate = rate(unwrap(optimizer).iterations)
  return tf.cast(tf.convert_to_tensor(rate), tf.float32)


def create_slots(optimizer: tf_keras.optimizers.Optimizer,
                 variables: List[tf.Variable]) -> None:
  """Creates the optimizer's slots for `variables` now, in the scope, rather
  than at the first `apply_gradients`."""
  inner = next(wrapper for wrapper in _wrappers(optimizer) if not isinstance(
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
