"""How `KerasModelTask` calls a data function: the input context goes only
to the parameter meant for it.

A parameter takes the `tf.distribute.InputContext` where it is named
`input_context` or annotated `tf.distribute.InputContext`; every other
parameter is the function's own, given by gin or its default. Handing the
context to the first parameter whatever its name fed it to
`digits_examples(training)`, bound `eval/digits_examples.training = False`:
the context is truthy, and the eval set was the training split.
"""

import inspect
import re
import typing
from typing import Callable, List, Optional

import tensorflow as tf

from trainer import errors
from trainer import graph_code

CONTEXT_NAME = "input_context"


def context_parameter(function: Callable) -> Optional[str]:
  """The name of `function`'s parameter meant for the input context (named
  `input_context` or annotated `tf.distribute.InputContext`), or None."""
  for parameter in _parameters(function):
    if parameter.name == CONTEXT_NAME or _is_context(parameter.annotation):
      return parameter.name
  return None


def call(setting: str, function: Callable,
         input_context: Optional[tf.distribute.InputContext]):
  """Calls the data function bound to `setting`, with the input context
  where it has a parameter for it, by keyword: its other parameters are
  left to gin and their defaults.

  Raises:
    errors.ConfigError: Where a required parameter is given by no one
      (neither gin nor a default), naming it and the ways out.
  """
  name = context_parameter(function)
  try:
    return graph_code.user_code(function)(
        **({name: input_context} if name else {}))
  except TypeError as e:
    missing = _not_given(function, name, e)
    if not missing:
      raise
    what = getattr(function, "__name__", "function")
    listed = ", ".join(f"`{m}`" for m in missing)
    raise errors.ConfigError(
        f"`{setting}` ({what}) has the required parameter"
        f"{'s' if len(missing) > 1 else ''} {listed}, which nothing gives: "
        f"bind it in gin (`{what}.{missing[0]} = ...`; scoped, "
        f"`eval/{what}.{missing[0]} = ...` with `@eval/{what}`, where the "
        "sets differ) or give it a default; only a parameter named "
        f"`{CONTEXT_NAME}` or annotated `tf.distribute.InputContext` is "
        "given the input context.") from e


def _parameters(function: Callable) -> List[inspect.Parameter]:
  try:
    return list(inspect.signature(function).parameters.values())
  except (TypeError, ValueError):  # Builtins and the like: called bare.
    return []


def _is_context(annotation) -> bool:
  if isinstance(annotation, str):  # `from __future__ import annotations`.
    return re.search(r"\bInputContext\b", annotation) is not None
  return (annotation is tf.distribute.InputContext or
          tf.distribute.InputContext in typing.get_args(annotation))


def _not_given(function: Callable, context: Optional[str],
               error: TypeError) -> List[str]:
  """The required parameters the call failed for: none where the
  function's own code ran (its TypeError is its own), else those the
  message names (gin's wrapper passes the bound ones)."""
  code = getattr(inspect.unwrap(function), "__code__", None)
  trace = error.__traceback__
  while trace is not None:
    if trace.tb_frame.f_code is code:
      return []
    trace = trace.tb_next
  required = [p.name for p in _parameters(function)
              if p.name != context and p.default is inspect.Parameter.empty
              and p.kind not in (inspect.Parameter.VAR_POSITIONAL,
                                 inspect.Parameter.VAR_KEYWORD)]
  return [name for name in required if f"'{name}'" in str(error)]
