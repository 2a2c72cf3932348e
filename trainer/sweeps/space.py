"""The search space: `--space` flags parsed into Optuna distributions.

    --space='optimizer.learning_rate=[0.001, 0.003, 0.01]'   a choice (grid)
    --space='optimizer.learning_rate=loguniform(1e-4, 1e-1)'
    --space='trainer.global_batch_size=int(16, 128)'
    --space='model.dropout=uniform(0.0, 0.5)'

A choice's values stay gin text (`0.001`, `"adam"`, `@Adam`), so every value
gin accepts can be swept; they are Optuna's categorical choices.
"""

import ast
import dataclasses
import math
import re
from typing import Any, Dict, List, Sequence, Tuple, Union

from optuna import distributions

from trainer import errors

RANGES = ("loguniform", "uniform", "int")
_BINDING = re.compile(r"^[A-Za-z_][\w./]*\.[A-Za-z_]\w*$")
_RANGE = re.compile(r"^(\w+)\s*\((.*)\)$")
_FORMS = ("a list [a, b, ...], loguniform(a, b), uniform(a, b) or "
          "int(a, b)")


@dataclasses.dataclass(frozen=True)
class Dimension:
  """One swept binding.

  Attributes:
    binding: The gin binding, e.g. `optimizer.learning_rate`.
    kind: 'choice' or one of `RANGES`.
    choices: A choice's values as gin text.
    low: A range's lower end.
    high: A range's upper end.
  """
  binding: str
  kind: str
  choices: Tuple[str, ...] = ()
  low: float = 0.0
  high: float = 0.0

  @property
  def spec(self) -> str:
    """The flag's value, normalised: `binding=[a, b]`, `binding=int(1, 8)`."""
    if self.kind == "choice":
      return f"{self.binding}=[{', '.join(self.choices)}]"
    return f"{self.binding}={self.kind}({self.low:g}, {self.high:g})"

  def distribution(self) -> distributions.BaseDistribution:
    """The Optuna distribution this dimension samples from."""
    if self.kind == "choice":
      return distributions.CategoricalDistribution(self.choices)
    if self.kind == "int":
      return distributions.IntDistribution(int(self.low), int(self.high))
    return distributions.FloatDistribution(
        self.low, self.high, log=self.kind == "loguniform")

  def edge_values(self) -> List[Any]:
    """The values a configuration check tries: every choice, or both ends."""
    if self.kind == "choice":
      return list(self.choices)
    if self.kind == "int":
      return [int(self.low), int(self.high)]
    return [self.low, self.high]


def gin_text(value: Any) -> str:
  """A sampled value as a gin binding's right-hand side."""
  if isinstance(value, float):
    return repr(value)
  return str(value)


def plain_value(value: Any) -> Union[bool, int, float, str]:
  """A value as a number where its gin text is one (for tables, CSV and
  TensorBoard's HParams); other gin text as it is."""
  if isinstance(value, str):
    try:
      literal = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      return value
    if isinstance(literal, (bool, int, float, str)):
      return literal
  return value


def _split_list(text: str) -> List[str]:
  """Splits `a, "b, c", [d, e]` at its top-level commas."""
  items, depth, quote, current = [], 0, "", ""
  for char in text:
    if quote:
      quote = "" if char == quote else quote
    elif char in "'\"":
      quote = char
    elif char in "([{":
      depth += 1
    elif char in ")]}":
      depth -= 1
    elif char == "," and depth == 0:
      items.append(current.strip())
      current = ""
      continue
    current += char
  if current.strip():
    items.append(current.strip())
  return items


def _number(text: str, flag: str) -> float:
  try:
    value = float(text)
  except ValueError:
    raise errors.ConfigError(
        f"`--space={flag}`: `{text.strip()}` is not a number.") from None
  if not math.isfinite(value):
    raise errors.ConfigError(
        f"`--space={flag}`: `{text.strip()}` is not a finite number.")
  return value


def _parse_range(name: str, arguments: str, binding: str,
                 flag: str) -> Dimension:
  if name not in RANGES:
    raise errors.ConfigError(
        f"`--space={flag}`: unknown range `{name}`; give {_FORMS}.")
  parts = [part for part in arguments.split(",")]
  if len(parts) != 2:
    raise errors.ConfigError(
        f"`--space={flag}`: `{name}` takes two numbers, low and high.")
  low, high = (_number(part, flag) for part in parts)
  if name == "int" and not (low.is_integer() and high.is_integer()):
    raise errors.ConfigError(
        f"`--space={flag}`: `int` takes whole numbers.")
  if low >= high:
    raise errors.ConfigError(
        f"`--space={flag}`: low ({low:g}) must be below high ({high:g}).")
  if name == "loguniform" and low <= 0:
    raise errors.ConfigError(
        f"`--space={flag}`: `loguniform` needs a positive low, not {low:g}.")
  return Dimension(binding, name, low=low, high=high)


def parse_dimension(flag: str) -> Dimension:
  """Parses one `--space` value.

  Raises:
    errors.ConfigError: The value cannot be parsed.
  """
  binding, equals, values = flag.partition("=")
  binding, values = binding.strip(), values.strip()
  if not equals or not values:
    raise errors.ConfigError(
        f"`--space={flag}` must be BINDING=VALUES, e.g. "
        "--space='optimizer.learning_rate=[0.001, 0.01]'.")
  if not _BINDING.match(binding):
    raise errors.ConfigError(
        f"`--space={flag}`: `{binding}` is not a gin binding "
        "(configurable.parameter).")
  if values.startswith("[") and values.endswith("]"):
    choices = tuple(_split_list(values[1:-1]))
    if not choices:
      raise errors.ConfigError(f"`--space={flag}`: the list is empty.")
    if len(set(choices)) != len(choices):
      raise errors.ConfigError(
          f"`--space={flag}`: the list repeats a value.")
    return Dimension(binding, "choice", choices=choices)
  found = _RANGE.match(values)
  if not found:
    raise errors.ConfigError(
        f"`--space={flag}`: cannot parse `{values}`; give {_FORMS}.")
  return _parse_range(found.group(1), found.group(2), binding, flag)


def parse_space(flags: Sequence[str]) -> List[Dimension]:
  """Parses every `--space` flag; a binding may be swept once.

  Raises:
    errors.ConfigError: No flag, a flag that cannot be parsed, or a binding
      given twice.
  """
  if not flags:
    raise errors.ConfigError(
        "give at least one --space, e.g. "
        "--space='optimizer.learning_rate=[0.001, 0.01]'.")
  space = [parse_dimension(flag) for flag in flags]
  bindings = [dimension.binding for dimension in space]
  for binding in bindings:
    if bindings.count(binding) > 1:
      raise errors.ConfigError(f"`--space` sweeps `{binding}` twice.")
  return space


def grid(space: Sequence[Dimension]) -> Dict[str, List[Any]]:
  """The grid for Optuna's `GridSampler`: every dimension must be a list.

  Raises:
    errors.ConfigError: A dimension is a range.
  """
  for dimension in space:
    if dimension.kind != "choice":
      raise errors.ConfigError(
          f"--sampler=grid needs lists; `--space={dimension.spec}` is a "
          "range: give a list, or use --sampler=random or tpe.")
  return {dimension.binding: list(dimension.choices) for dimension in space}


def grid_size(space: Sequence[Dimension]) -> int:
  """The number of points of a grid of lists."""
  return math.prod(len(dimension.choices) for dimension in space)


def gin_params(params: Dict[str, Any]) -> List[str]:
  """A trial's parameters as `--gin_param` bindings, in the trial's order."""
  return [f"{binding}={gin_text(value)}" for binding, value in params.items()]


def first_point(space: Sequence[Dimension]) -> Dict[str, Any]:
  """A point of the space: each dimension's first edge value."""
  return {dimension.binding: dimension.edge_values()[0]
          for dimension in space}
