"""Per-part optimizers: a model's trainable variables split by name pattern,
each part updated by an optimizer of its own.

`trainer.optimizer_parts` names the parts and the pattern (a regular
expression searched in each variable's name) that chooses their variables:
every trainable variable belongs to exactly one part. Each part's optimizer
is what `Task.create_optimizer` returns under the gin scope of its name, so
`head/optimizer.name = "sgd"` gives the head its own kind of optimizer and
`backbone/optimizer.learning_rate = 1e-4` its own rate or schedule, while
unscoped bindings hold for every part; `trainer.learning_rate_multipliers`
scales a part's rate (its whole schedule) instead.

`PartitionedOptimizer` holds the parts as one tf_keras legacy optimizer, so
that everything around one optimizer holds for it: the one backward pass of
the step's loss, float16 loss scaling (one loss, so one scale), EMA,
clipping (of the whole model's gradient), checkpoints (each part's slots
under `optimizer/<part>/`) and the NaN guard. It is written by hand because
tf_keras has no per-variable optimizer (TensorFlow Addons' MultiOptimizer,
which had one, is gone) and Model Garden offers none.
"""

import re
from typing import Dict, Iterable, List, Mapping, Optional

import tensorflow as tf
import tf_keras

from trainer import checks
from trainer import errors


def check(parts: Optional[Mapping[str, str]],
          multipliers: Optional[Mapping[str, float]]) -> None:
  """Checks `trainer.optimizer_parts` and `trainer.learning_rate_multipliers`.

  Raises:
    errors.ConfigError: For a malformed setting, a pattern that is no
      regular expression, or a multiplier for no part.
  """
  if multipliers is not None:
    checks.require(
        parts is not None,
        "`trainer.learning_rate_multipliers` needs `trainer.optimizer_parts`"
        ": the parts whose rates it scales.")
  if parts is None:
    return
  checks.require(
      isinstance(parts, Mapping) and len(parts) > 0 and all(
          isinstance(k, str) and k and isinstance(v, str)
          for k, v in parts.items()),
      f"`trainer.optimizer_parts` ({parts!r}) must map part names to "
      "variable-name patterns, e.g. {'backbone': '^conv', 'head': '^dense'}.")
  for name, pattern in parts.items():
    checks.require(
        re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", name) is not None,
        f"`trainer.optimizer_parts` name {name!r} must be a gin scope name "
        "(letters, digits, _ . -).")
    try:
      re.compile(pattern)
    except re.error as e:
      raise errors.ConfigError(
          f"`trainer.optimizer_parts` pattern {pattern!r} of part '{name}' "
          f"is not a regular expression: {e}.") from e
  for name, factor in (multipliers or {}).items():
    checks.require(
        name in parts,
        f"`trainer.learning_rate_multipliers` names '{name}', which is not "
        f"one of `trainer.optimizer_parts`: {', '.join(parts)}.")
    checks.require(
        checks.is_number(factor) and factor > 0,
        f"`trainer.learning_rate_multipliers` '{name}' ({factor!r}) must be a "
        "positive number.")


def _short(variable: tf.Variable) -> str:
  return variable.name.split(":")[0]


def assign(parts: Mapping[str, str],
           variables: Iterable[tf.Variable]) -> Dict[str, List[tf.Variable]]:
  """Splits `variables` into the parts whose patterns their names match.

  Raises:
    errors.ConfigError: For a pattern that matches no variable, a variable
      two patterns match (two optimizers would own it), or one that none
      matches.
  """
  variables = list(variables)
  owned = {name: [] for name in parts}
  unowned = []
  for variable in variables:
    owners = [name for name, pattern in parts.items()
              if re.search(pattern, _short(variable))]
    if len(owners) > 1:
      raise errors.ConfigError(
          f"variable {_short(variable)} matches the patterns of parts "
          f"{' and '.join(repr(o) for o in owners)} of "
          "`trainer.optimizer_parts`: two optimizers cannot own one "
          "variable; make the patterns exclusive.")
    if owners:
      owned[owners[0]].append(variable)
    else:
      unowned.append(_short(variable))
  for name, pattern in parts.items():
    if not owned[name]:
      raise errors.ConfigError(
          f"`trainer.optimizer_parts` pattern {pattern!r} of part '{name}' "
          "matches no trainable variable; the model's are: "
          f"{_some([_short(v) for v in variables], 6)}.")
  if unowned:
    raise errors.ConfigError(
        f"`trainer.optimizer_parts` leaves {len(unowned)} trainable "
        f"variable(s) without an optimizer: {_some(unowned, 4)}; add a part "
        "whose pattern matches them.")
  return owned


def _some(names: List[str], shown: int) -> str:
  """`names` joined with commas, the first `shown` only and how many more."""
  if len(names) <= shown:
    return ", ".join(names)
  return f"{', '.join(names[:shown])} and {len(names) - shown} more"


class PartitionedOptimizer(tf_keras.optimizers.legacy.Optimizer):
  """Updates each variable with the optimizer of the part that owns it.

  Its learning rate and step counter, where one is asked for (the progress
  line, an EMA's start step), are its first part's; every part takes one
  step per `apply_gradients`.
  """

  def __init__(self, parts: Mapping[str, tf_keras.optimizers.Optimizer],
               variables: Mapping[str, List[tf.Variable]],
               name: str = "PartitionedOptimizer"):
    """Groups `parts`' optimizers.

    Args:
      parts: Part name -> its optimizer (tf_keras legacy).
      variables: Part name -> the variables it owns (`assign`).
      name: The optimizer's name.
    """
    super().__init__(name)
    self._parts = dict(parts)
    for part, optimizer in self._parts.items():
      self._track_trackable(optimizer, name=part)
    self._owner = {variable.ref(): part for part, owned in variables.items()
                   for variable in owned}
    self._owned = {part: list(owned) for part, owned in variables.items()}

  @property
  def parts(self) -> Dict[str, tf_keras.optimizers.Optimizer]:
    """Part name -> its optimizer."""
    return dict(self._parts)

  def _first(self) -> tf_keras.optimizers.Optimizer:
    return next(iter(self._parts.values()))

  @property
  def iterations(self):
    return self._first().iterations

  @iterations.setter
  def iterations(self, variable):
    del variable  # Each part counts its own steps.

  @property
  def learning_rate(self):
    return self._first().learning_rate

  def apply_gradients(self, grads_and_vars, name: Optional[str] = None,
                      experimental_aggregate_gradients: bool = True):
    """Hands each part its own `(gradient, variable)` pairs."""
    del name
    grouped = {part: [] for part in self._parts}
    for grad, variable in grads_and_vars:
      part = self._owner.get(variable.ref())
      if part is None:
        raise errors.ConfigError(
            f"variable {_short(variable)} got a gradient but belongs to no "
            "part of `trainer.optimizer_parts` (it was not trainable when "
            "the parts were assigned).")
      if grad is not None:
        grouped[part].append((grad, variable))
    return tf.group([
        self._parts[part].apply_gradients(
            pairs,
            experimental_aggregate_gradients=experimental_aggregate_gradients)
        for part, pairs in grouped.items() if pairs])

  def _create_all_weights(self, var_list):
    wanted = {variable.ref() for variable in var_list}
    for part, optimizer in self._parts.items():
      optimizer._create_all_weights(  # pylint: disable=protected-access
          [v for v in self._owned[part] if v.ref() in wanted])

  def variables(self):
    return [variable for optimizer in self._parts.values()
            for variable in optimizer.variables()]

  @property
  def weights(self):
    return self.variables()

  def get_config(self):
    return {"name": self._name, "parts": sorted(self._parts)}
