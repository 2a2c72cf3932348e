"""`trainer.checks`: each helper's exact one-line message."""

import dataclasses
from typing import Optional

import pytest

from trainer import checks
from trainer import errors


def _message(check, *args, **kwargs) -> str:
  with pytest.raises(errors.ConfigError) as raised:
    check(*args, **kwargs)
  return str(raised.value)


def test_is_int_and_is_number_refuse_booleans():
  assert checks.is_int(3) and not checks.is_int(3.0)
  assert not checks.is_int(True) and not checks.is_int("3")
  assert checks.is_number(3) and checks.is_number(0.5)
  assert not checks.is_number(False) and not checks.is_number("0.5")


def test_require():
  checks.require(True, "unused")
  assert _message(checks.require, False, "`a.b` needs `a.c`.") == (
      "`a.b` needs `a.c`.")


def test_choice():
  checks.choice("a.mode", "x", ("x", "y"))
  checks.choice("a.mode", None, ("x", "y"), optional=True)
  assert _message(checks.choice, "a.mode", "z", ("x", "y")) == (
      "`a.mode` ('z') must be one of: x, y.")
  assert _message(checks.choice, "a.mode", None, ("x", "y")) == (
      "`a.mode` (None) must be one of: x, y.")
  assert _message(checks.choice, "a.mode", "z", ("x", "y"),
                  optional=True) == (
                      "`a.mode` ('z') must be None or one of: x, y.")


def test_positive():
  checks.positive("a.steps", 1)
  checks.positive("a.seconds", 0.5)
  assert _message(checks.positive, "a.steps", 0) == (
      "`a.steps` (0) must be positive.")
  assert _message(checks.positive, "a.steps", "1") == (
      "`a.steps` ('1') must be positive.")
  assert _message(checks.positive, "a.steps", True) == (
      "`a.steps` (True) must be positive.")


def test_at_least():
  checks.at_least("a.packs", 1, 1)
  assert _message(checks.at_least, "a.packs", 0, 1) == (
      "`a.packs` (0) must be >= 1.")
  assert _message(checks.at_least, "a.delta", -0.5, 0) == (
      "`a.delta` (-0.5) must be >= 0.")
  assert _message(checks.at_least, "a.delta", None, 0) == (
      "`a.delta` (None) must be >= 0.")


def test_integer():
  checks.integer("a.n", -3)
  checks.integer("a.n", 0, minimum=0)
  checks.integer("a.n", None, minimum=1, optional=True)
  assert _message(checks.integer, "a.n", 1.5) == (
      "`a.n` (1.5) must be an integer.")
  assert _message(checks.integer, "a.n", False) == (
      "`a.n` (False) must be an integer.")
  assert _message(checks.integer, "a.n", "1", optional=True) == (
      "`a.n` ('1') must be an integer or None.")
  assert _message(checks.integer, "a.n", 0, minimum=1) == (
      "`a.n` (0) must be a positive integer.")
  assert _message(checks.integer, "a.n", 0, minimum=1, optional=True) == (
      "`a.n` (0) must be a positive integer or None.")
  assert _message(checks.integer, "a.n", -1, minimum=0) == (
      "`a.n` (-1) must be an integer >= 0.")


def test_number():
  checks.number("a.x", -0.5)
  checks.number("a.x", 0, minimum=0)
  checks.number("a.x", None, above_zero=True, optional=True)
  assert _message(checks.number, "a.x", "1") == (
      "`a.x` ('1') must be a number.")
  assert _message(checks.number, "a.x", 0, above_zero=True) == (
      "`a.x` (0) must be a positive number.")
  assert _message(checks.number, "a.x", -1.0, above_zero=True,
                  optional=True) == (
                      "`a.x` (-1.0) must be a positive number or None.")
  assert _message(checks.number, "a.x", -1, minimum=0, optional=True) == (
      "`a.x` (-1) must be a number >= 0 or None.")
  assert _message(checks.number, "a.x", True, minimum=0) == (
      "`a.x` (True) must be a number >= 0.")


def test_boolean():
  checks.boolean("a.flag", False)
  assert _message(checks.boolean, "a.flag", "yes") == (
      "`a.flag` ('yes') must be True or False.")
  assert _message(checks.boolean, "a.flag", 1) == (
      "`a.flag` (1) must be True or False.")


@dataclasses.dataclass
class _Settings:
  count: int = 1
  seed: Optional[int] = None
  eager: bool = False
  rate: float = 0.5  # Not checked by `field_types`.
  name: str = "x"


def test_field_types():
  checks.field_types("a", _Settings())
  checks.field_types("a", _Settings(seed=3, rate="fast", name=None))
  assert _message(checks.field_types, "a", _Settings(count=True)) == (
      "`a.count` (True) must be an integer.")
  assert _message(checks.field_types, "a", _Settings(seed=1.0)) == (
      "`a.seed` (1.0) must be an integer or None.")
  assert _message(checks.field_types, "a", _Settings(eager=0)) == (
      "`a.eager` (0) must be True or False.")
