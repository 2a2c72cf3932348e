"""The configured optimizer hyperparameters, put back over a restore.

A tf_keras optimizer keeps a constant learning rate, and a legacy one also
its other hyperparameters (`beta_1`, `momentum`, `decay`...), as variables,
and a checkpoint holds them: restoring one puts the checkpoint's values over
those just configured (measured: a resume at `optimizer.learning_rate=1e-12`
trained at the old 1e-3). `configured` reads what the optimizers were built
with, before any restore; `assign` puts it back after each restore, so the
run trains with the settings it is given. Schedules are no variables: they
take the step, which is restored, and are the new run's already.
"""

import dataclasses
from typing import Dict, List, Tuple

import tensorflow as tf
import tf_keras

from trainer.model import named
from trainer.model import optimization


def _owners(optimizer) -> List[tf_keras.optimizers.Optimizer]:
  """The optimizers that own hyperparameters inside `optimizer` (of one
  model): itself unwrapped (loss scaling, EMA), or each per-part one."""
  inner = optimization.unwrap(optimizer)
  parts = optimization.parts(inner)
  if parts:
    return [owner for part in parts.values() for owner in _owners(part)]
  return [inner]


def _values(owner: tf_keras.optimizers.Optimizer) -> Dict[str, float]:
  """The hyperparameters of `owner` that a restore would replace, by name:
  every number (or variable) of a legacy optimizer's `_hyper`; a newer
  optimizer's learning-rate variable (its other settings are attributes,
  which no checkpoint holds)."""
  if isinstance(owner, tf_keras.optimizers.legacy.Optimizer):
    hypers = owner._hyper  # pylint: disable=protected-access
  else:
    hypers = {"learning_rate": getattr(owner, "_learning_rate", None)}
  values = {}
  for name, value in hypers.items():
    if isinstance(value, tf.Variable):
      values[name] = float(value.numpy())
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
      values[name] = float(value)
    # Schedules and other callables, and tensors, are not restored.
  return values


@dataclasses.dataclass(frozen=True)
class Configured:
  """The hyperparameters each optimizer was built with.

  Attributes:
    values: `(optimizer, ((name, value), ...))` for each optimizer that owns
      hyperparameters.
  """
  values: Tuple[Tuple[tf_keras.optimizers.Optimizer,
                      Tuple[Tuple[str, float], ...]], ...] = ()


def configured(optimizer) -> Configured:
  """Reads the hyperparameters of `optimizer` (or of the optimizers by
  model name) as built; call before any restore."""
  found = []
  for each in named.named(optimizer).values():
    for owner in _owners(each):
      values = _values(owner)
      if values:
        found.append((owner, tuple(sorted(values.items()))))
  return Configured(tuple(found))


def assign(configured_values: Configured
           ) -> List[Tuple[str, float, float]]:
  """Puts the configured hyperparameters over what a restore put there.

  A legacy optimizer creates its hyperparameter variables on first use; a
  checkpoint restored before that fills them when they are created
  (deferred restoration), so they are created here first. Call in the
  strategy scope, after the restore.

  Returns:
    The values it replaced, `(name, restored, configured)`, of those that
    differed, in the order of `configured_values`.
  """
  replaced = []
  for owner, values in configured_values.values:
    if isinstance(owner, tf_keras.optimizers.legacy.Optimizer):
      owner._create_hypers()  # pylint: disable=protected-access
      variables = owner._hyper  # pylint: disable=protected-access
    else:
      variables = {"learning_rate": owner._learning_rate}  # pylint: disable=protected-access
    for name, value in values:
      variable = variables.get(name)
      if not isinstance(variable, tf.Variable):
        continue
      # Compared in the variable's precision: 1e-3 is not a float32.
      wanted = tf.cast(value, variable.dtype)
      restored = variable.numpy()
      if restored != wanted.numpy():
        replaced.append((name, float(restored), value))
        variable.assign(wanted)
  return replaced
