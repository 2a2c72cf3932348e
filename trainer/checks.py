"""Checks of configuration values, each raising one `errors.ConfigError`.

The messages follow one pattern, Orbit's: the setting in backticks, the bad
value in parentheses, then what it must be ("`trainer.steps_per_loop` (0)
must be positive."). `name` is always the setting's full gin name
(`trainer.steps_per_loop`, `runtime.num_gpus`).
"""

import dataclasses
from typing import Any, Iterable, Optional

from trainer import errors


def is_int(value: Any) -> bool:
  """Whether `value` is an integer; True and False are not."""
  return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
  """Whether `value` is an int or a float; True and False are not."""
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def require(condition: bool, message: str) -> None:
  """Raises `message` unless `condition` holds; for the checks that name
  more than one setting, or say more than what a value must be.

  Raises:
    errors.ConfigError: If `condition` is false.
  """
  if not condition:
    raise errors.ConfigError(message)


def _expect(name: str, value: Any, ok: bool, what: str,
            optional: bool) -> None:
  """Raises "`name` (value) must be <what>[ or None]." unless `ok` (or
  `value` is None and `optional`)."""
  if not ok and not (optional and value is None):
    raise errors.ConfigError(f"`{name}` ({value!r}) must be {what}"
                             f"{' or None' if optional else ''}.")


def choice(name: str, value: Any, choices: Iterable[str],
           optional: bool = False) -> None:
  """Checks that `value` is one of `choices` (or None, when `optional`).

  Raises:
    errors.ConfigError: "`name` (value) must be one of: a, b." (or "must be
      None or one of: a, b.").
  """
  choices = tuple(choices)
  prefix = "None or one of" if optional else "one of"
  _expect(name, value, value in choices or (optional and value is None),
          f"{prefix}: {', '.join(choices)}", False)


def positive(name: str, value: Any) -> None:
  """Checks that `value` is a number above 0.

  Raises:
    errors.ConfigError: "`name` (value) must be positive."
  """
  _expect(name, value, is_number(value) and value > 0, "positive", False)


def at_least(name: str, value: Any, minimum: float) -> None:
  """Checks that `value` is a number no smaller than `minimum`.

  Raises:
    errors.ConfigError: "`name` (value) must be >= minimum."
  """
  _expect(name, value, is_number(value) and value >= minimum,
          f">= {minimum}", False)


def integer(name: str, value: Any, minimum: Optional[int] = None,
            optional: bool = False) -> None:
  """Checks that `value` is an integer, at least `minimum` if given (or
  None, when `optional`).

  Raises:
    errors.ConfigError: "`name` (value) must be an integer." Variants: "a
      positive integer" (`minimum=1`), "an integer >= 0" (`minimum=0`),
      ending " or None" when `optional`.
  """
  what = ("an integer" if minimum is None else
          "a positive integer" if minimum == 1 else
          f"an integer >= {minimum}")
  _expect(name, value,
          is_int(value) and (minimum is None or value >= minimum), what,
          optional)


def number(name: str, value: Any, minimum: Optional[float] = None,
           above_zero: bool = False, optional: bool = False) -> None:
  """Checks that `value` is a number: above 0 with `above_zero`, at least
  `minimum` if given (or None, when `optional`).

  Raises:
    errors.ConfigError: "`name` (value) must be a number." Variants: "a
      positive number" (`above_zero`), "a number >= 0" (`minimum=0`),
      ending " or None" when `optional`.
  """
  what = ("a positive number" if above_zero else
          "a number" if minimum is None else f"a number >= {minimum}")
  _expect(name, value,
          is_number(value) and (minimum is None or value >= minimum) and
          (not above_zero or value > 0), what, optional)


def boolean(name: str, value: Any) -> None:
  """Checks that `value` is True or False.

  Raises:
    errors.ConfigError: "`name` (value) must be True or False."
  """
  _expect(name, value, isinstance(value, bool), "True or False", False)


def field_types(prefix: str, config: Any) -> None:
  """Checks the fields of dataclass `config` declared `int`, `bool` or
  `Optional[int]` (other fields are left to the caller).

  Args:
    prefix: The configurable's gin name (`trainer`); the messages name
      `prefix.field`.
    config: A dataclass instance.

  Raises:
    errors.ConfigError: For the first field holding another type, as
      `integer` and `boolean` word it.
  """
  for field in dataclasses.fields(config):
    name, value = f"{prefix}.{field.name}", getattr(config, field.name)
    if field.type is int:
      integer(name, value)
    elif field.type == Optional[int]:
      integer(name, value, optional=True)
    elif field.type is bool:
      boolean(name, value)
