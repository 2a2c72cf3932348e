"""Several models in one Task, by name, each with its own optimizer.

A Task's `build_model` may return `{"generator": g, "discriminator": d}`:
the framework then builds one optimizer per model that has trainable
variables (a frozen teacher gets none), each from the gin bindings under the
scope of the model's name (`generator/optimizer.learning_rate = 2e-4`,
`discriminator/trainer.gradient_clip_norm = 1.0` for the clipping that
`trainer.minimize` applies), and hands both dicts, by name, to the Task's
`train_step` and its other hooks.
Each optimizer is scaled for the batch, loss-scaled in float16 (its own
scale: each model has its own loss) and, for the model `ema.model` names,
averaged; checkpoints hold `model/<name>/...` and `optimizer/<name>/...`.
A Task with one model keeps the plain `model` and `optimizer` it always had.
"""

import collections.abc
import re
from typing import Any, Dict, Iterable, Mapping, Optional, Set

import tf_keras

from trainer import errors
from trainer import graph_code

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


def named(value: Any) -> Dict[str, Any]:
  """The models (or optimizers) of a Task by name; one model is `""`."""
  if value is None:
    return {}
  return dict(value) if several(value) else {"": value}


@graph_code.written_for_graphs
def several(value: Any) -> bool:
  """Whether a Task built several (named) models.

  (`collections.abc.Mapping`, not `typing.Mapping`: a dict kept by a
  `tf.Module` is a proxy that only the former recognises.)
  """
  return isinstance(value, collections.abc.Mapping)


def check_models(task_name: str, models: Any) -> None:
  """Checks what `build_model` returned.

  Raises:
    errors.ConfigError: For something that is no tf_keras model (or dict of
      them), a name that cannot be a gin scope, or a variable that two
      models share (two optimizers would own it).
  """
  if not several(models):
    if not isinstance(models, tf_keras.Model):
      raise errors.ConfigError(
          f"{task_name}.build_model returned {type(models).__name__}: return "
          "a tf_keras.Model, or a dict of them by name.")
    return
  if not models:
    raise errors.ConfigError(f"{task_name}.build_model returned an empty "
                             "dict: name at least one model.")
  owner = {}
  for name, model in models.items():
    if not isinstance(name, str) or not _NAME.match(name):
      raise errors.ConfigError(
          f"{task_name}.build_model names a model {name!r}: names are gin "
          "scopes (letters, digits, _ . -, not starting with a digit).")
    if not isinstance(model, tf_keras.Model):
      raise errors.ConfigError(
          f"{task_name}.build_model returned {type(model).__name__} for "
          f"'{name}': each value must be a tf_keras.Model.")
    for variable in model.trainable_variables:
      other = owner.setdefault(variable.ref(), name)
      if other != name:
        raise errors.ConfigError(
            f"models '{other}' and '{name}' of {task_name} share the "
            f"trainable variable {variable.name.split(':')[0]}: two "
            "optimizers cannot own one variable; freeze it in one model "
            "(`layer.trainable = False`) or give each model its own layer.")


def check_choice(setting: str, name: Optional[str], models: Any) -> None:
  """Checks a setting that names one of several models (`ema.model`,
  `export.model`, `warm_start.model`).

  Raises:
    errors.ConfigError: If it names no model, or is missing where there
      are several.
  """
  names = list(named(models))
  if not several(models):
    if name is not None:
      raise errors.ConfigError(
          f"`{setting}` ({name!r}) names one of several models, but the "
          "Task builds one: leave it unset.")
    return
  if name is None:
    raise errors.ConfigError(
        f"the Task builds several models ({', '.join(names)}): set "
        f"`{setting}` to the one it applies to.")
  if name not in names:
    raise errors.ConfigError(
        f"`{setting}` ({name!r}) names no model of the Task; its models are "
        f"{', '.join(names)}.")


def check_scopes(scopes: Set[str], names: Iterable[str], what: str) -> None:
  """Raises if gin binds optimizer settings under a scope that names none
  of `names` (a misspelt model or part: gin itself accepts any scope)."""
  names = list(names)
  unknown = sorted(scopes - set(names))
  if unknown:
    raise errors.ConfigError(
        f"gin binds settings under `{unknown[0]}/` (`optimizer.*`, "
        f"`learning_rate.*` or `trainer.*`), but no {what} is named "
        f"'{unknown[0]}'"
        f"{'; the ' + what + 's are ' + ', '.join(names) if names else ''}.")


def trainable(models: Mapping[str, tf_keras.Model]
              ) -> Dict[str, tf_keras.Model]:
  """The models an optimizer trains: those with trainable variables."""
  return {name: model for name, model in models.items()
          if model.trainable_variables}


def variables(models: Any) -> list:
  """Every variable of every model, in name order."""
  return [v for _, model in sorted(named(models).items())
          for v in model.variables]


def weights(models: Any) -> list:
  """Every weight of every model, in name order (what a fingerprint
  hashes)."""
  return [w for _, model in sorted(named(models).items())
          for w in model.weights]


def describe(variables_: Iterable) -> str:
  """E.g. `4 variable(s), 18,816 parameters`, of a model's (or a part's)
  trainable variables."""
  variables_ = list(variables_)
  size = sum(int(v.shape.num_elements()) for v in variables_)
  return f"{len(variables_)} variable(s), {size:,} parameters"


def first(value: Any) -> Any:
  """The first of several named values (for a single reading where one is
  needed, e.g. the progress line's learning rate)."""
  return next(iter(named(value).values()), None)

