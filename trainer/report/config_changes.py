"""What changed in the configuration since the run a checkpoint came from.

A resumed run is configured anew, but what it restores was trained under
the run before's configuration, which that run wrote to
`model_dir/operative_config.gin` (`summaries.write_operative_config`). Both
are read as gin bindings (scope, configurable, parameter) with their values
as gin writes them, and compared: the `resume |` line lists the bindings
that differ, and the resume decides from them what cannot take effect (an
optimizer of another kind) and what must be done for it to take effect (a
batch size: the input position).

The old file must be read before the resumed run writes its own over it,
after its first loop.
"""

import dataclasses
import os
from typing import Dict, Optional, Sequence, Tuple

import gin
from gin import config_parser
import tensorflow as tf

from trainer.report import summaries
from trainer.storage import files


class _Reference:
  """A configurable reference or macro, kept as gin writes it."""

  def __init__(self, text: str):
    self.text = text

  def __eq__(self, other) -> bool:
    return isinstance(other, _Reference) and other.text == self.text

  def __hash__(self) -> int:
    return hash(self.text)

  def __repr__(self) -> str:
    return self.text


class _Delegate(config_parser.ParserDelegate):
  """Keeps references and macros as text: nothing is looked up or called,
  so a configurable the new run no longer imports reads as well."""

  def configurable_reference(self, scoped_configurable_name, evaluate):
    return _Reference(f"@{scoped_configurable_name}" +
                      ("()" if evaluate else ""))

  def macro(self, macro_name):
    return _Reference(f"%{macro_name}")


def bindings(text: str) -> Dict[str, str]:
  """The bindings of a gin config, `[scope/]configurable.parameter` ->
  the value as gin writes it (`1e-12`, `'adam'`, `@DigitsClassification()`).
  """
  found = {}
  for statement in config_parser.ConfigParser(text, _Delegate()):
    if isinstance(statement, config_parser.BindingStatement):
      scope = f"{statement.scope}/" if statement.scope else ""
      found[f"{scope}{statement.selector}.{statement.arg_name}"] = repr(
          statement.value)
  return found


def read(directory: str) -> Optional[Dict[str, str]]:
  """The bindings of `directory/operative_config.gin`; None where there is
  none (the run before ended before its first loop) or it cannot be read."""
  path = os.path.join(directory, summaries.OPERATIVE_CONFIG_FILE)
  try:
    text = files.read_text(path)
    return None if text is None else bindings(text)
  # A URL's read fails with TensorFlow's errors, not `OSError`.
  except (OSError, tf.errors.OpError, SyntaxError, ValueError):
    return None


def operative() -> Dict[str, str]:
  """The bindings this run used so far (`gin.operative_config_str`): once
  its parts are built, every configurable has been called."""
  return bindings(gin.operative_config_str())


# Shown for a binding that only one of the two configurations uses.
UNUSED = "(unused)"


@dataclasses.dataclass(frozen=True)
class Change:
  """A binding whose value differs between two configurations.

  Attributes:
    binding: `[scope/]configurable.parameter`, e.g. `optimizer.learning_rate`
      or `generator/optimizer.name`.
    old: Its value in the checkpoint's run, as gin writes it; None: unused.
    new: Its value in this run; None: unused.
  """
  binding: str
  old: Optional[str]
  new: Optional[str]

  @property
  def unscoped(self) -> str:
    """`configurable.parameter`, without a scope."""
    return self.binding.rsplit("/", 1)[-1]

  def __str__(self) -> str:
    return (f"{self.binding} {UNUSED if self.old is None else self.old} -> "
            f"{UNUSED if self.new is None else self.new}")


def changes(old: Dict[str, str], new: Dict[str, str]) -> Tuple[Change, ...]:
  """The bindings that differ between `old` and `new`, sorted by name."""
  return tuple(Change(name, old.get(name), new.get(name))
               for name in sorted(set(old) | set(new))
               if old.get(name) != new.get(name))


def named(found: Sequence[Change], binding: str) -> Tuple[Change, ...]:
  """The changes of `binding` (`configurable.parameter`) under any scope."""
  return tuple(change for change in found if change.unscoped == binding)


def line(step: int, found: Sequence[Change]) -> Optional[str]:
  """The `resume |` line listing `found`; None when nothing changed."""
  if not found:
    return None
  return (f"resume | changed since step {step}: "
          f"{', '.join(str(change) for change in found)}")
