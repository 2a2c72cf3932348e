"""Renders the configuration reference page from the configurables.

Every gin configurable of `trainer/` and `tasks/` documents its parameters
itself: a dataclass in its `Attributes:` section, a function or a Task in
the `Args:` section of its (`__init__`) docstring. This script reads them,
with the defaults from `dataclasses.fields` or the signature, and prints the
Markdown reference; `--write` puts it into docs/reference/configuration.md
between the markers

  <!-- config-reference:start -->
  <!-- config-reference:end -->

    python scripts/config_reference.py           # prints the reference
    python scripts/config_reference.py --write   # updates the page
    python scripts/config_reference.py --check   # exit 1 if the page is stale

Edit the docstrings, not the page, then run it with `--write`
(`tests/test_docs.py` fails while the two differ).
"""

import argparse
import dataclasses
import importlib
import inspect
import json
import os
import pkgutil
import re
import sys
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO_ROOT = os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))  # local-path: this repository
if REPO_ROOT not in sys.path:
  sys.path.insert(0, REPO_ROOT)

# pylint: disable=g-import-not-at-top,wrong-import-position
import gin

PAGE = os.path.join(REPO_ROOT, "docs", "reference", "configuration.md")
PAGE_NAME = os.path.relpath(PAGE, REPO_ROOT)  # local-path: this repository
START = "<!-- config-reference:start -->"
END = "<!-- config-reference:end -->"
PACKAGES = ("trainer", "tasks")
HEADING = "##"
# The order of the reference; configurables not listed follow, by module.
ORDER = ("experiment", "trainer", "optimizer", "learning_rate", "ema",
         "warm_start", "export", "best_checkpoint", "early_stopping",
         "runtime", "DigitsClassification", "MnistClassification",
         "Cifar10Classification", "ImageNetResNet50", "ImdbSentiment",
         "HashedRecommendation", "SplitDigitsMLP", "TFRecordSource")
REQUIRED = "required"
_SECTIONS = ("Args", "Arguments", "Attributes", "Returns", "Yields", "Raises",
             "Example", "Examples", "Note", "Notes")
_ENTRY = re.compile(r"^(\*{0,2}\w+)(?:\s*\([^)]*\))?:\s*(.*)$")
_CONSTANT = re.compile(r"`([A-Z][A-Z0-9_]+)`")


class Parameter(NamedTuple):
  """One gin parameter of a configurable."""
  name: str
  default: Any  # `inspect.Parameter.empty` or `gin.REQUIRED`: required.
  description: Optional[str]  # None: no entry in the docstring.


class Configurable(NamedTuple):
  """One gin configurable and its documentation."""
  name: str  # As bound in gin: `trainer`, `DigitsClassification`.
  target: Callable  # The decorated class or function.
  description: List[str]  # Paragraphs before the docstring's sections.
  parameters: List[Parameter]

  @property
  def source(self) -> str:
    module = sys.modules[self.target.__module__]
    return os.path.relpath(  # local-path: a source file of this repository
        inspect.getsourcefile(module), REPO_ROOT)


def import_packages() -> None:
  """Imports every module of `PACKAGES`, registering their configurables."""
  for package_name in PACKAGES:
    package = importlib.import_module(package_name)
    for module in pkgutil.iter_modules(package.__path__):
      importlib.import_module(f"{package_name}.{module.name}")


def registered() -> Dict[str, Callable]:
  """Returns gin name -> class or function, for `PACKAGES`' configurables."""
  registry = gin.config._REGISTRY  # pylint: disable=protected-access
  return {c.name: c.wrapped for _, c in registry.items()
          if c.module.split(".")[0] in PACKAGES}


def split_docstring(doc: Optional[str]) -> Tuple[List[str], Dict[str, Dict[
    str, str]]]:
  """Splits a Google-style docstring.

  Args:
    doc: The docstring (None for none).

  Returns:
    The paragraphs before the first section, each on one line, and
    section name -> {entry name -> its text on one line} for the sections
    with entries (`Args`, `Attributes`).
  """
  lines = inspect.cleandoc(doc or "").splitlines()
  paragraphs, sections, current = [], {}, None
  paragraph: List[str] = []
  entries: Dict[str, List[str]] = {}
  entry = entry_indent = None
  for line in lines:
    stripped = line.strip()
    header = stripped[:-1] if stripped.endswith(":") else None
    if not line.startswith(" ") and header in _SECTIONS:
      current, entry, entry_indent = header, None, None
      entries = sections.setdefault(current, {})
      continue
    if current is None:
      if stripped:
        paragraph.append(stripped)
      elif paragraph:
        paragraphs.append(" ".join(paragraph))
        paragraph = []
      continue
    if not stripped:
      continue
    indent = len(line) - len(line.lstrip())
    match = _ENTRY.match(stripped)
    if match and (entry_indent is None or indent == entry_indent):
      entry_indent = indent
      entry = match.group(1)
      entries[entry] = [match.group(2)] if match.group(2) else []
    elif entry is not None and indent > entry_indent:
      entries[entry].append(stripped)
  if paragraph:
    paragraphs.append(" ".join(paragraph))
  return paragraphs, {name: {key: " ".join(words)
                             for key, words in section.items()}
                      for name, section in sections.items()}


def _init_chain(cls: type) -> List[Tuple[type, inspect.Signature]]:
  """The `__init__`s whose parameters `cls` takes: its own and, while they
  pass `**kwargs` on, those of its bases."""
  chain = []
  for klass in cls.__mro__:
    if "__init__" not in vars(klass) or klass is object:
      continue
    signature = inspect.signature(vars(klass)["__init__"])
    chain.append((klass, signature))
    if not any(p.kind is p.VAR_KEYWORD
               for p in signature.parameters.values()):
      break
  return chain


def parameters(target: Callable) -> List[Parameter]:
  """Returns the gin parameters of a configurable, documented or not."""
  configurable_targets = list(registered().values())
  if dataclasses.is_dataclass(target):
    docs = split_docstring(target.__doc__)[1].get("Attributes", {})
    result = []
    for field in dataclasses.fields(target):
      if not field.init:
        continue
      if field.default is not dataclasses.MISSING:
        default = field.default
      elif field.default_factory in configurable_targets:
        default = field.default_factory  # Written `@name()`.
      elif field.default_factory is not dataclasses.MISSING:
        default = field.default_factory()
      else:
        default = inspect.Parameter.empty
      result.append(Parameter(field.name, default, docs.get(field.name)))
    return result
  if inspect.isclass(target):
    chain = _init_chain(target)
  else:
    chain = [(target, inspect.signature(target))]
  result, seen = [], set()
  class_docs = split_docstring(target.__doc__)[1]
  for owner, signature in chain:
    init = vars(owner)["__init__"] if inspect.isclass(owner) else owner
    docs = dict(class_docs.get("Attributes", {}))
    docs.update(split_docstring(init.__doc__)[1].get("Args", {}))
    for name, parameter in signature.parameters.items():
      if (name in ("self", "cls") or name in seen or parameter.kind in (
          parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)):
        continue
      seen.add(name)
      result.append(Parameter(name, parameter.default, docs.get(name)))
  return result


def configurables() -> List[Configurable]:
  """Returns `PACKAGES`' gin configurables in the reference's order."""
  import_packages()
  targets = registered()
  names = sorted(targets, key=lambda n: (
      ORDER.index(n) if n in ORDER else len(ORDER),
      targets[n].__module__, n))
  return [Configurable(name, targets[name],
                       split_docstring(targets[name].__doc__)[0],
                       parameters(targets[name]))
          for name in names]


def is_required(default: Any) -> bool:
  return default is inspect.Parameter.empty or default is gin.REQUIRED


def gin_literal(value: Any, names: Dict[Callable, str]) -> str:
  """Writes a default value as a gin binding would (`@name()` for a
  configurable built by a dataclass's `default_factory`)."""
  if inspect.isclass(value) or inspect.isroutine(value):
    return f"@{names[value]}()" if value in names else value.__qualname__
  if isinstance(value, str):
    return json.dumps(value)
  if isinstance(value, tuple):
    inner = ", ".join(gin_literal(v, names) for v in value)
    return f"({inner},)" if len(value) == 1 else f"({inner})"
  if isinstance(value, list):
    return "[" + ", ".join(gin_literal(v, names) for v in value) + "]"
  if isinstance(value, dict):
    return "{" + ", ".join(f"{gin_literal(k, names)}: {gin_literal(v, names)}"
                           for k, v in value.items()) + "}"
  return repr(value)


def _expand_constants(text: str, target: Callable) -> str:
  """Lists the values of a module constant a description names
  (`One of \\`STRATEGIES\\``), unless the text lists them already."""
  module = sys.modules[target.__module__]

  def expand(match):
    value = getattr(module, match.group(1), None)
    if not isinstance(value, (tuple, list, dict)) or not all(
        isinstance(v, str) for v in value):
      return match.group(0)
    if all(re.search(rf"\b{re.escape(v)}\b", text) for v in value):
      return match.group(0)
    return f"{match.group(0)} ({', '.join(f'`{v}`' for v in value)})"

  return _CONSTANT.sub(expand, text)


def _cell(text: str) -> str:
  return text.replace("|", "\\|")


def render() -> str:
  """Returns the Markdown reference (without the markers)."""
  items = configurables()
  names = {c.target: c.name for c in items}
  out = [
      "<!-- Generated by scripts/config_reference.py from the docstrings of "
      "the configurables; edit those and run "
      "`python scripts/config_reference.py --write`. -->",
      "",
      "Every parameter is a gin binding, `name.parameter = value`: "
      "`trainer.train_steps = 2000`, `DigitsClassification.filters = 64`.",
      "",
      "- The framework: " + ", ".join(
          f"[`{c.name}`](#{c.name.lower()})" for c in items
          if c.target.__module__.startswith("trainer.")) + ".",
      "- The shipped tasks and their inputs: " + ", ".join(
          f"[`{c.name}`](#{c.name.lower()})" for c in items
          if not c.target.__module__.startswith("trainer.")) + ".",
  ]
  for item in items:
    out += ["", f"{HEADING} `{item.name}`", ""]
    out += [paragraph + "\n" for paragraph in item.description]
    out += [f"`{item.target.__name__}` in `{item.source}`.", ""]
    out += ["| parameter | default | meaning |", "| --- | --- | --- |"]
    for parameter in item.parameters:
      default = (REQUIRED if is_required(parameter.default) else
                 f"`{gin_literal(parameter.default, names)}`")
      meaning = _expand_constants(parameter.description or "", item.target)
      out.append(f"| `{parameter.name}` | {_cell(default)} | "
                 f"{_cell(meaning)} |")
  return "\n".join(out) + "\n"


def page_section(page: str) -> str:
  """Returns what the reference page holds between the markers.

  Raises:
    ValueError: If a marker is missing.
  """
  if START not in page or END not in page:
    raise ValueError(f"{PAGE_NAME} has no {START} ... {END} section.")
  return page[page.index(START) + len(START):page.index(END)].strip(
      "\n") + "\n"


def main(argv: Optional[List[str]] = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  group = parser.add_mutually_exclusive_group()
  group.add_argument("--write", action="store_true",
                     help=f"Replace the reference in {PAGE_NAME}.")
  group.add_argument("--check", action="store_true",
                     help=f"Exit 1 if {PAGE_NAME} is not current.")
  args = parser.parse_args(argv)
  reference = render()
  if not (args.write or args.check):
    sys.stdout.write(reference)
    return 0
  with open(PAGE, encoding="utf-8") as f:  # local-path: this repository
    page = f.read()
  try:
    current = page_section(page)
  except ValueError as e:
    print(f"config_reference.py: error: {e}", file=sys.stderr)
    return 2
  if current == reference:
    print(f"{PAGE_NAME}: the configuration reference is current.")
    return 0
  if args.check:
    print(f"{PAGE_NAME}: the configuration reference is stale; run "
          "`python scripts/config_reference.py --write`.", file=sys.stderr)
    return 1
  updated = (page[:page.index(START) + len(START)] + "\n" + reference +
             page[page.index(END):])
  with open(PAGE, "w", encoding="utf-8") as f:  # local-path: this repository
    f.write(updated)
  print(f"{PAGE_NAME}: configuration reference updated.")
  return 0


if __name__ == "__main__":
  sys.exit(main())
