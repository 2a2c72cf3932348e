"""README.md: the configuration reference matches the configurables'
docstrings and defaults, the sections keep their order, links resolve."""

import ast
import dataclasses
import importlib.util
import inspect
import os
import re
from typing import Any, Callable, Dict, List, Tuple

import gin
import pytest

import helpers

README = os.path.join(helpers.REPO_ROOT, "README.md")
SCRIPT = os.path.join(helpers.REPO_ROOT, "scripts", "config_reference.py")
SECTIONS = ["Quick start", "Writing a Task", "Running", "Features",
            "Distributed training", "When things go wrong", "Reference",
            "License"]


def _load_script():
  spec = importlib.util.spec_from_file_location("config_reference", SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.fixture(scope="module")
def script():
  return _load_script()


@pytest.fixture(scope="module")
def rendered(script):
  return script.render()


@pytest.fixture(scope="module")
def readme():
  with open(README, encoding="utf-8") as f:
    return f.read()


@pytest.fixture(scope="module")
def targets(script) -> Dict[str, Callable]:
  """Gin name -> class or function, read from gin's own registry."""
  script.import_packages()
  registry = gin.config._REGISTRY  # pylint: disable=protected-access
  return {c.name: c.wrapped for _, c in registry.items()
          if c.module.split(".")[0] in ("trainer", "tasks")}


def _reference(readme: str) -> str:
  start, end = "<!-- config-reference:start -->", "<!-- config-reference:end -->"
  assert readme.count(start) == 1 and readme.count(end) == 1, (
      "README.md needs one `config-reference` start and end marker.")
  return readme[readme.index(start) + len(start):readme.index(end)]


def _tables(reference: str) -> Dict[str, Dict[str, str]]:
  """Heading name -> {parameter -> its default cell}, parsed from text."""
  tables, current = {}, None
  for line in reference.splitlines():
    heading = re.match(r"^#+ `([^`]+)`\s*$", line)
    if heading:
      current = tables.setdefault(heading.group(1), {})
      continue
    row = re.match(r"^\| `([^`]+)` \| ((?:[^|\\]|\\.)*?) \|", line)
    if row and current is not None:
      assert row.group(1) not in current, f"{row.group(1)} listed twice"
      current[row.group(1)] = row.group(2).replace("\\|", "|")
  return tables


def _parameters(target: Callable) -> List[Tuple[str, Any]]:
  """(name, default) of every gin parameter; defaults of dataclass fields
  built by `default_factory` are the factory itself."""
  if dataclasses.is_dataclass(target):
    return [(f.name, f.default if f.default is not dataclasses.MISSING
             else f.default_factory if f.default_factory
             is not dataclasses.MISSING else inspect.Parameter.empty)
            for f in dataclasses.fields(target) if f.init]
  functions = [target]
  if inspect.isclass(target):
    functions = []
    for klass in target.__mro__:
      if klass is object or "__init__" not in vars(klass):
        continue
      functions.append(vars(klass)["__init__"])
      if not any(p.kind is p.VAR_KEYWORD for p in inspect.signature(
          functions[-1]).parameters.values()):
        break
  result = {}
  for function in functions:
    for name, p in inspect.signature(function).parameters.items():
      if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
        result.setdefault(name, p.default)
  return list(result.items())


def _documented(doc: str, section: str) -> set:
  """Entry names of a docstring's `Attributes:` or `Args:` section."""
  lines = inspect.cleandoc(doc or "").splitlines()
  if f"{section}:" not in lines:
    return set()
  names, indent = set(), None
  for line in lines[lines.index(f"{section}:") + 1:]:
    if line and not line.startswith(" "):
      break  # The next section.
    match = re.match(r"^( +)(\*{0,2}\w+)(?: \([^)]*\))?:", line)
    if match and (indent is None or len(match.group(1)) == indent):
      indent = len(match.group(1))
      names.add(match.group(2))
  return names


def test_the_reference_is_generated_from_the_docstrings(readme, rendered):
  current = _reference(readme).strip("\n") + "\n"
  assert current == rendered, (
      "README.md's configuration reference differs from the configurables' "
      "docstrings; run `python scripts/config_reference.py --write`.")


def test_every_configurable_has_a_section(readme, targets):
  tables = _tables(_reference(readme))
  assert sorted(tables) == sorted(targets)


def test_every_parameter_is_listed_with_its_default(readme, targets):
  tables = _tables(_reference(readme))
  names = {target: name for name, target in targets.items()}
  for name, target in targets.items():
    rows = tables[name]
    parameters = _parameters(target)
    assert list(rows) == [p for p, _ in parameters], name
    for parameter, default in parameters:
      cell = rows[parameter]
      where = f"{name}.{parameter}: {cell}"
      if default is inspect.Parameter.empty or default is gin.REQUIRED:
        assert cell == "required", where
      elif cell.startswith("`@"):
        assert cell == f"`@{names[default]}()`", where
      else:
        assert cell.startswith("`") and cell.endswith("`"), where
        value = default() if callable(default) else default
        assert ast.literal_eval(cell[1:-1]) == value, where
        assert type(ast.literal_eval(cell[1:-1])) is type(value), where


def test_every_parameter_has_a_description_in_its_docstring(targets):
  missing = {}
  for name, target in targets.items():
    if dataclasses.is_dataclass(target):
      documented = _documented(target.__doc__, "Attributes")
    else:
      functions = [target] if not inspect.isclass(target) else [
          vars(k)["__init__"] for k in target.__mro__
          if k is not object and "__init__" in vars(k)]
      documented = set().union(*(_documented(f.__doc__, "Args")
                                 for f in functions))
    gaps = {p for p, _ in _parameters(target)} - documented
    if gaps:
      missing[name] = gaps
  for name, gaps in missing.items():
    assert not gaps, (
        f"`{name}`: no docstring entry for {sorted(gaps)}; document them in "
        "its `Attributes:` (dataclass) or `Args:` section.")


def test_documented_names_are_parameters(targets):
  for name, target in targets.items():
    if dataclasses.is_dataclass(target):
      extra = _documented(target.__doc__, "Attributes") - {
          p for p, _ in _parameters(target)}
      assert not extra, f"`{name}` documents non-fields {sorted(extra)}"


def test_the_top_level_sections_keep_their_order(readme):
  prose = re.sub(r"```.*?```", "", readme, flags=re.S)
  assert re.findall(r"^## (.+)$", prose, flags=re.M) == SECTIONS


def _slug(heading: str) -> str:
  """GitHub's anchor of a heading."""
  text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
  return text.replace(" ", "-")


def test_links_resolve(readme):
  prose = re.sub(r"```.*?```", "", readme, flags=re.S)
  anchors = {_slug(h) for h in re.findall(r"^#+ (.+)$", prose, flags=re.M)}
  for target in re.findall(r"\]\(([^)\s]+)\)", prose):
    if target.startswith("#"):
      assert target[1:] in anchors, f"no heading for the link {target}"
    elif "://" not in target:
      path = target.split("#")[0]
      assert os.path.exists(os.path.join(helpers.REPO_ROOT, path)), target


def test_benchmark_figures_live_in_docs(readme):
  with open(os.path.join(helpers.REPO_ROOT, "docs", "benchmarks.md"),
            encoding="utf-8") as f:
    benchmarks = f.read()
  for command in ("python scripts/benchmark.py",
                  "python scripts/benchmark_input.py",
                  "python scripts/compare_strategies.py"):
    assert command in benchmarks
  assert "the run before" not in readme
  assert "docs/benchmarks.md" in readme
