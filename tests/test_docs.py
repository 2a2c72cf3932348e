"""The manual, README.md and the MkDocs site in docs/, against the code.

- The configuration reference (docs/reference/configuration.md) is the one
  `scripts/config_reference.py` generates from the configurables'
  docstrings, and lists every parameter with its default.
- The site builds with `mkdocs build --strict` (broken links, missing pages
  and docstring warnings fail it), its navigation keeps the newcomer's
  order, README.md stays a front door (at most 10 KB) whose links resolve,
  and `.ci/run` runs the README's test command verbatim.
- Every fenced code block has a language, and every block in a runnable
  language (sh, bash, shell, console, python, gin) is one of:
  a file (its first line is `# NAME.py` or `# NAME.gin`), written to the
  page's directories before its commands run (Python files are compiled,
  gin files parsed); a command block, run by the slow
  `test_the_page_runs_as_written`; a gin or Python block, parsed or compiled
  here and (Python) run by the slow test; or one marked on the line before
  its fence with `<!-- not run here: REASON -->` (a GPU, a cluster) or
  `<!-- run by tests/test_x.py: WHAT -->` (that test must read the page).

How the slow test runs a page's command blocks, in the page's order, each in
a new `bash` (`set -e` for sh blocks), with the virtual environment's
`bin/` first on PATH (so `python` is the one the tests run under):

- A block naming `/path/to/` runs in the user's project directory (a new
  temporary directory holding the page's files), `/path/to/` being this
  repository; any other block runs from the repository's root as the page
  says, here a fresh copy of the repository (no `runs/`, no `site/`) that
  also holds the page's files, with `.venv` linked to the running
  environment.
- The Quick start's `python3 -m venv .venv && .venv/bin/pip install -e . && `
  is left out: it is the install `.ci/run` has done before the tests.
- Commands are shortened: a `train.py` command that binds no
  `trainer.train_steps` itself gets `--gin_param=trainer.train_steps=200`;
  `scripts/benchmark.py` gets `--rounds=1 --steps=100`,
  `scripts/benchmark_input.py` `--rounds=1 --steps=10 --cached_batches=5`,
  `scripts/compare_strategies.py` `--steps=20`. Everything else runs as
  written, and background jobs (`&`) are waited for.
- A console block's `$ ` lines are its commands and the other lines the
  output they print: each must match a line of the combined stdout and
  stderr, with numbers standing for any number (they depend on the machine)
  and `...` for any text. Its exit status is 0, or the N of an
  `<!-- exit code N -->` line before the fence; an sh block must exit 0.
"""

import ast
import dataclasses
import glob
import importlib
import importlib.util
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import gin
import pytest
import yaml

import helpers

REPO_ROOT = helpers.REPO_ROOT
README = os.path.join(REPO_ROOT, "README.md")
DOCS = os.path.join(REPO_ROOT, "docs")
MKDOCS_YML = os.path.join(REPO_ROOT, "mkdocs.yml")
README_LIMIT = 10 * 1024
# The order of the manual, for a newcomer.
NAV = ["Getting started", "Writing a Task", "Configuration with gin",
       "Distributed training", "Precision and performance", "Reliability",
       "Tools", "Reference", "Benchmarks"]
SHELL = ("sh", "bash", "shell", "console")
RUNNABLE = SHELL + ("python", "gin")
QUICK_START_INSTALL = "python3 -m venv .venv && .venv/bin/pip install -e . && "
TRAIN_STEPS = 200
SHORTER = {
    "scripts/benchmark.py": "--rounds=1 --steps=100",
    "scripts/benchmark_input.py": "--rounds=1 --steps=10 --cached_batches=5",
    "scripts/compare_strategies.py": "--steps=20",
}
BLOCK_TIMEOUT = 600
# The pages that may name test files: the one about developing this project.
DEVELOPMENT_PAGES = ("docs/reference/development.md",)
# The page that keeps earlier measurements, to show how much runs vary.
MEASUREMENT_PAGES = ("docs/benchmarks.md",)


class Block(NamedTuple):
  """A fenced code block of a page."""
  page: str  # Relative to the repository: `docs/gin.md`.
  line: int  # The fence's line, from 1.
  language: str
  text: str
  marker: Optional[str]  # The HTML comment on the line before the fence.

  @property
  def name(self) -> str:
    return f"{self.page}:{self.line}"

  @property
  def file_name(self) -> Optional[str]:
    """`NAME.py` or `NAME.gin` when the first line names the file."""
    if self.language not in ("python", "gin"):
      return None
    first = self.text.split("\n", 1)[0]
    found = re.fullmatch(r"# ([\w.-]+\.(?:py|gin))", first.strip())
    return found.group(1) if found else None

  @property
  def not_run(self) -> bool:
    return bool(self.marker and re.match(r"not run here: \S", self.marker))

  @property
  def run_by(self) -> Optional[str]:
    found = self.marker and re.match(r"run by (tests/[\w/]+\.py): \S",
                                     self.marker)
    return found.group(1) if found else None

  @property
  def exit_code(self) -> int:
    found = self.marker and re.fullmatch(r"exit code (\d+)", self.marker)
    return int(found.group(1)) if found else 0


def pages() -> List[str]:
  """README.md and every page under docs/, relative to the repository."""
  found = ["README.md"]
  for directory, _, files in sorted(os.walk(DOCS)):
    found += sorted(os.path.relpath(os.path.join(directory, f), REPO_ROOT)
                    for f in files if f.endswith(".md"))
  return found


def blocks(page: str) -> List[Block]:
  """The fenced blocks of a page, with the marker before each."""
  with open(os.path.join(REPO_ROOT, page), encoding="utf-8") as f:
    lines = f.read().split("\n")
  result, i = [], 0
  while i < len(lines):
    fence = re.match(r"^(`{3,})(\S*)\s*$", lines[i])
    if not fence:
      i += 1
      continue
    end = i + 1
    while end < len(lines) and lines[end].strip() != fence.group(1):
      end += 1
    before = lines[i - 1].strip() if i else ""
    comment = re.fullmatch(r"<!--\s*(.*?)\s*-->", before)
    result.append(Block(page, i + 1, fence.group(2),
                        "\n".join(lines[i + 1:end]) + "\n",
                        comment.group(1) if comment else None))
    i = end + 1
  return result


def all_blocks() -> List[Block]:
  return [block for page in pages() for block in blocks(page)]


def _prose(page: str) -> str:
  """A page without its code blocks and HTML comments."""
  with open(os.path.join(REPO_ROOT, page), encoding="utf-8") as f:
    text = f.read()
  text = re.sub(r"^(`{3,}).*?^\1\s*$", "", text, flags=re.S | re.M)
  return re.sub(r"<!--.*?-->", "", text, flags=re.S)


# The reference against the code.


def _load_script():
  spec = importlib.util.spec_from_file_location(
      "config_reference", os.path.join(REPO_ROOT, "scripts",
                                       "config_reference.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.fixture(scope="module")
def script():
  return _load_script()


@pytest.fixture(scope="module")
def reference_page(script):
  with open(script.PAGE, encoding="utf-8") as f:
    return f.read()


@pytest.fixture(scope="module")
def targets(script) -> Dict[str, Callable]:
  """Gin name -> class or function, read from gin's own registry."""
  script.import_packages()
  registry = gin.config._REGISTRY  # pylint: disable=protected-access
  return {c.name: c.wrapped for _, c in registry.items()
          if c.module.split(".")[0] in ("trainer", "tasks")}


def _reference(page: str) -> str:
  start = "<!-- config-reference:start -->"
  end = "<!-- config-reference:end -->"
  assert page.count(start) == 1 and page.count(end) == 1, (
      "docs/reference/configuration.md needs one `config-reference` start "
      "and end marker.")
  return page[page.index(start) + len(start):page.index(end)]


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


def test_the_reference_is_generated_from_the_docstrings(script,
                                                         reference_page):
  assert script.page_section(reference_page) == script.render(), (
      "docs/reference/configuration.md differs from the configurables' "
      "docstrings; run `python scripts/config_reference.py --write`.")


def test_every_configurable_has_a_section(reference_page, targets):
  tables = _tables(_reference(reference_page))
  assert sorted(tables) == sorted(targets)


def test_every_parameter_is_listed_with_its_default(reference_page, targets):
  tables = _tables(_reference(reference_page))
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


# The site and the README.


def test_the_navigation_keeps_the_newcomers_order():
  with open(MKDOCS_YML, encoding="utf-8") as f:
    config = yaml.safe_load(f)
  titles = [next(iter(entry)) for entry in config["nav"]]
  assert titles == NAV

  def files(entries):
    for entry in entries:
      value = next(iter(entry.values())) if isinstance(entry, dict) else entry
      if isinstance(value, list):
        yield from files(value)
      else:
        yield value

  listed = sorted(os.path.join("docs", f) for f in files(config["nav"]))
  assert listed == sorted(p for p in pages() if p != "README.md")


def test_mkdocs_builds_the_site_strictly(tmp_path):
  pytest.importorskip("mkdocs")
  pytest.importorskip("mkdocstrings")
  result = subprocess.run(
      [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
       str(tmp_path / "site")], cwd=REPO_ROOT, capture_output=True,
      text=True, timeout=300, check=False,
      env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
  assert result.returncode == 0, result.stderr[-5000:]
  assert "WARNING" not in result.stderr, result.stderr[-5000:]
  assert os.path.exists(tmp_path / "site" / "reference" / "api" /
                        "index.html")


def test_the_api_reference_documents_the_public_symbols():
  import trainer  # pylint: disable=g-import-not-at-top
  with open(os.path.join(DOCS, "reference", "api.md"), encoding="utf-8") as f:
    documented = re.findall(r"^::: trainer\.(\w+)$", f.read(), flags=re.M)
  assert sorted(documented) == sorted(trainer.__all__)
  assert documented[0] == "Task"


def test_the_readme_is_a_front_door():
  assert os.path.getsize(README) <= README_LIMIT
  with open(README, encoding="utf-8") as f:
    readme = f.read()
  for heading in ("## Install", "## Quick start", "## A minimal Task",
                  "## Documentation", "## License"):
    assert heading in readme
  prose = _prose("README.md")
  for target in re.findall(r"\]\(([^)\s]+)\)", prose):
    if target.startswith("#"):
      slugs = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
               for h in re.findall(r"^#+ (.+)$", prose, flags=re.M)}
      assert target[1:] in slugs, target
    elif "://" not in target:
      assert os.path.exists(os.path.join(REPO_ROOT, target.split("#")[0])), (
          target)


def test_commands_install_and_serve_from_the_quick_starts_environment():
  # A bare `pip install -e '.[docs]' && mkdocs serve` leaves the Quick
  # start's .venv: it installs the whole stack again into another Python.
  for page in pages():
    for block in blocks(page):
      if block.language not in SHELL:
        continue
      bare = re.findall(r"(?:^|[\s;&|(])((?:pip3?|mkdocs)\s)", block.text,
                        flags=re.M)
      assert not bare, (f"{block.name}: write .venv/bin/{bare[0].strip()}, "
                        "the Quick start's environment")


def test_ci_runs_the_readme_test_command_and_builds_the_site():
  with open(README, encoding="utf-8") as f:
    readme = f.read()
  command = next(b.text.strip() for b in blocks("README.md")
                 if "python -m pytest" in b.text)
  assert command in readme
  with open(os.path.join(REPO_ROOT, ".ci", "run"), encoding="utf-8") as f:
    ci = f.read()
  assert command in ci.splitlines()
  assert ".venv/bin/mkdocs build --strict" in ci


def test_pages_cite_no_tests_and_keep_no_history():
  for page in pages():
    prose = _prose(page)
    if page not in DEVELOPMENT_PAGES:
      assert not re.search(r"tests/([\w/]+/)?test_\w+", prose), page
    if page not in MEASUREMENT_PAGES:
      assert not re.search(r"(?i)\bmeasured in session|the run before",
                           prose), page


# A module, class or function named in backticks (`trainer.loop.control.hooks`), or
# a `trainer.<parameter>` gin binding; `trainer.gradient_clip_*` is a prefix.
# Not a name that a string literal in code continues on its next line.
_DOTTED_NAME = re.compile(
    r"`(trainer(?:\.[A-Za-z_][A-Za-z0-9_]*)+)(\*?)(?![\w\"'])")
_NAMING_FILES = ("docs/**/*.md", "README.md", "train.py", "trainer/**/*.py",
                 "tasks/**/*.py", "scripts/**/*.py", "sweeps/**/*.py")


def _resolves(dotted: str, prefix: bool, bindings: set) -> bool:
  """Whether `dotted` names a module or an attribute of one, or (as
  `trainer.<name>`) a binding of the `trainer` configurable, or a field of
  a Model Garden experiment's `trainer` (`trainer.optimizer_config`, as
  `--params_override` names it)."""
  parts = dotted.split(".")
  if len(parts) == 2 and (parts[1].isupper() or parts[1] in bindings or (
      prefix and any(name.startswith(parts[1]) for name in bindings))):
    return True  # `trainer.NAME` is a placeholder.
  if _experiment_field(parts):
    return True
  for length in range(len(parts), 1, -1):
    module = ".".join(parts[:length])
    if _find_spec_or_none(module) is None:
      continue
    target = importlib.import_module(module)
    for attribute in parts[length:]:
      if not hasattr(target, attribute):
        return False
      target = getattr(target, attribute)
    return True
  return hasattr(importlib.import_module("trainer"), parts[1])


def _experiment_field(parts: List[str]) -> bool:
  """Whether `parts` is the path of a field of Model Garden's
  `ExperimentConfig` (its defaults) under `trainer`."""
  from official.core import config_definitions  # pylint: disable=g-import-not-at-top
  target = config_definitions.ExperimentConfig()
  for name in parts:
    if not hasattr(target, name):
      return False
    target = getattr(target, name)
  return True


def _find_spec_or_none(name: str):
  try:
    return importlib.util.find_spec(name)
  except ModuleNotFoundError:  # A parent that is not a package.
    return None


def test_every_dotted_trainer_name_resolves():
  from trainer import config  # pylint: disable=g-import-not-at-top
  bindings = {field.name for field in dataclasses.fields(config.TrainerConfig)}
  unresolved = []
  for pattern in _NAMING_FILES:
    for path in sorted(glob.glob(os.path.join(REPO_ROOT, pattern),
                                 recursive=True)):
      with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
          for found in _DOTTED_NAME.finditer(line):
            if not _resolves(found.group(1), bool(found.group(2)), bindings):
              unresolved.append(f"{os.path.relpath(path, REPO_ROOT)}:"
                                f"{number}: {found.group(1)}")
  assert not unresolved, unresolved


def test_benchmark_figures_live_on_the_benchmarks_page():
  with open(os.path.join(DOCS, "benchmarks.md"), encoding="utf-8") as f:
    benchmarks = f.read()
  for command in ("python scripts/benchmark.py",
                  "python scripts/benchmark_input.py",
                  "python scripts/compare_strategies.py"):
    assert command in benchmarks
  assert "benchmarks.md" in _prose("docs/precision-and-performance.md")


# Every block is run or marked.


@pytest.mark.parametrize("block", all_blocks(), ids=lambda b: b.name)
def test_every_block_is_classified(block):
  assert block.language, (
      f"{block.name}: give the block a language (text for output)")
  if block.language not in RUNNABLE:
    return
  if block.marker and block.marker.startswith(("not run", "run by")):
    assert block.not_run or block.run_by, (
        f"{block.name}: a marker needs a reason: <!-- not run here: WHY --> "
        "or <!-- run by tests/test_x.py: WHAT -->")
  if block.run_by:
    with open(os.path.join(REPO_ROOT, block.run_by), encoding="utf-8") as f:
      assert os.path.basename(block.page) in f.read(), (
          f"{block.name}: {block.run_by} does not read {block.page}")
  if block.language == "console" and not block.not_run:
    assert block.text.startswith("$ "), (
        f"{block.name}: a console block starts with a `$ ` command")
  if block.marker and block.marker.startswith("exit code"):
    assert block.language == "console", (
        f"{block.name}: an exit code is stated for console blocks")


@pytest.mark.parametrize(
    "block", [b for b in all_blocks() if b.language == "python"],
    ids=lambda b: b.name)
def test_python_blocks_compile(block):
  compile(textwrap.dedent(block.text), block.name, "exec")


def _page_files(page: str) -> Dict[str, str]:
  return {b.file_name: b.text for b in blocks(page) if b.file_name}


# Parses gin texts in groups, each from its own directory (a page's files);
# stdin: [[directory, {name: text}], ...]. A group whose directory holds
# Python modules is parsed in a child forked from this process (TensorFlow
# imported, no op run yet): what its modules register with gin ends with
# the child, so no later group's texts parse by it, and the next page's
# `my_task.py` is imported afresh. One import of TensorFlow for every page:
# a process per such page cost 4 to 5 s of CPU each.
_GIN_PARSER = r'''
import json, multiprocessing, os, sys
import trainer
import gin
from trainer import gin_config  # Registers `experiment`.
sys.path.insert(0, os.path.join(gin_config.REPO_ROOT, "scripts"))
import config_reference
config_reference.import_packages()
gin.add_config_file_search_path(gin_config.REPO_ROOT)


def parse(directory, texts):
  os.chdir(directory)
  sys.path.insert(0, directory)
  results = {}
  for name, text in texts.items():
    gin.clear_config(clear_constants=True)
    try:
      gin.parse_config(text, skip_unknown=False)
      results[name] = None
    except Exception as e:  # Reported by the test.
      results[name] = f"{type(e).__name__}: {e}"
  sys.path.remove(directory)
  return results


def parse_and_send(directory, texts, connection):
  connection.send(parse(directory, texts))


fork = multiprocessing.get_context("fork")
results = {}
for directory, texts in json.load(sys.stdin):
  if not any(name.endswith(".py") for name in os.listdir(directory)):
    results.update(parse(directory, texts))
    continue
  receiving, sending = fork.Pipe(duplex=False)
  child = fork.Process(target=parse_and_send,
                       args=(directory, texts, sending))
  child.start()
  sending.close()
  try:
    results.update(receiving.recv())
  except EOFError:  # The child died: each of its texts says so.
    results.update(dict.fromkeys(texts, f"the parser of {directory} died"))
  child.join()
print("RESULTS " + json.dumps(results))
'''


def parse_gin(groups: List[Tuple[str, Dict[str, str]]]
              ) -> Dict[str, Optional[str]]:
  """Name -> None, or the error gin raised parsing its text; `groups` are
  (directory, {name: text}), each parsed from its directory. What a group's
  Python modules register with gin stays with that group (`_GIN_PARSER`):
  it must not make a later group's texts parse (nor clash with another
  page's `my_task.py`)."""
  result = subprocess.run(
      [sys.executable, "-c", _GIN_PARSER], input=json.dumps(groups),
      capture_output=True, text=True, timeout=300, check=False)
  line = [l for l in result.stdout.splitlines() if l.startswith("RESULTS ")]
  assert line, result.stderr[-3000:]
  return json.loads(line[0][len("RESULTS "):])


# Parsed by gin_results beside the pages' blocks: a binding of a parameter
# that does not exist, as `backbone/learning_rate.initial = 1e-4` once stood
# in the docs.
_REFUSED = "refused: backbone/learning_rate.initial = 1e-4"


@pytest.fixture(scope="module")
def gin_results(tmp_path_factory) -> Dict[str, Optional[str]]:
  """Name -> None, or the error gin raised parsing it: every gin block of
  every page (`page:line`), each page's files beside it; every binding in
  the pages' prose (`page: binding`, see below); and `_REFUSED`. In
  another process (`parse_gin`), where the pages' modules are imported,
  not in the tests' own."""
  prose = {f"{page}: {binding}": _checked_text(binding)
           for page in pages() for binding in prose_bindings(page)}
  prose[_REFUSED] = _REFUSED.split(": ", 1)[1]
  groups = [(str(tmp_path_factory.mktemp("prose")), prose)]
  for page in pages():
    gin_blocks = {b.name: b.text for b in blocks(page)
                  if b.language == "gin"}
    if not gin_blocks:
      continue
    directory = tmp_path_factory.mktemp("gin")
    for name, text in _page_files(page).items():
      (directory / name).write_text(text)
    groups.append((str(directory), gin_blocks))
  return parse_gin(groups)


def _failing_files(page: str) -> set:
  """The files a page's failing console commands load: its examples of
  mistakes, checked by the commands' expected errors instead."""
  names = set()
  for block in blocks(page):
    if block.language == "console" and block.exit_code:
      names |= set(re.findall(r"--gin_file=([\w.-]+\.gin)", block.text))
  return names


@pytest.mark.parametrize(
    "block", [b for b in all_blocks() if b.language == "gin"],
    ids=lambda b: b.name)
def test_gin_blocks_parse(block, gin_results):
  if block.file_name in _failing_files(block.page):
    return
  assert gin_results[block.name] is None, gin_results[block.name]


# Gin bindings written in the prose (`trainer.train_steps = 2000`, or in a
# `--gin_param=...`): each is parsed as gin would parse it from the command
# line, so a parameter that does not exist fails here. A placeholder value
# (`N`, `...`) is parsed as None; the name is still checked.
_BINDING_NAME = r"(?:[\w.-]+/)?[A-Za-z_]\w*(?:\.\w+)+"
_BINDING = re.compile(rf"^({_BINDING_NAME})\s*=\s*(.+)$")
_PLACEHOLDER_VALUES = {"...", "N", "2N", "K", "value", "@X", "@MyTask",
                       "@SomeTask()"}
# The general form of a binding, not one.
_TEMPLATES = {"name.parameter = value"}


def prose_bindings(page: str) -> List[str]:
  """The gin bindings in `page`'s inline code, in order, once each."""
  found = []
  for span in re.finditer(r"(?<!`)(`{1,2})(?!`)(.+?)(?<!`)\1(?!`)",
                          _prose(page)):
    code = span.group(2).strip()
    flags = [next(g for g in flag.groups() if g is not None)
             for flag in re.finditer(
                 r"--gin_param=(?:'([^']*)'|\"([^\"]*)\"|(\S+))", code)]
    for text in flags or [code]:
      binding = _BINDING.match(text)
      if not binding or text in _TEMPLATES or text in found:
        continue
      value = binding.group(2).strip()
      if "(" in value and not value.startswith("@"):
        continue  # Python (`model.noise = tf.random.Generator...`).
      found.append(text)
  return found


def _checked_text(binding: str) -> str:
  name, value = _BINDING.match(binding).groups()
  return f"{name} = None" if value.strip() in _PLACEHOLDER_VALUES else binding


def test_prose_bindings_are_found():
  bindings = prose_bindings("docs/features.md")
  assert 'head/optimizer.name = "sgd"' in bindings
  assert "trainer.keep_until_evaluated=True" in bindings  # In a flag.
  assert "model.noise = tf.random.Generator.from_seed(5)" not in (
      prose_bindings("docs/reliability.md"))
  assert _checked_text("trainer.train_steps=2N") == "trainer.train_steps = None"


def test_gin_refuses_a_binding_of_a_parameter_that_does_not_exist(
    gin_results):
  assert "doesn't have a parameter named 'initial'" in gin_results[_REFUSED]


@pytest.mark.parametrize("page", pages())
def test_bindings_in_the_prose_parse(page, gin_results):
  failures = {name: error for name, error in gin_results.items()
              if name.startswith(f"{page}: ") and error is not None}
  assert not failures, failures


# Running the pages.


def output_pattern(line: str) -> "re.Pattern[str]":
  """The regular expression an expected output line stands for."""
  parts = []
  for piece in re.split(r"(\.\.\.|\d+(?:\.\d+)?(?:e[-+]?\d+)?|\s+)", line):
    if piece == "...":
      parts.append(".*")
    elif re.fullmatch(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?", piece or "x"):
      parts.append(r"[-+]?[0-9][0-9.e+-]*")
    elif piece and piece.isspace():
      parts.append(r"\s+")
    else:
      parts.append(re.escape(piece))
  return re.compile("".join(parts).strip())


def shorten(command: str) -> str:
  """A logical command line as the slow test runs it (see the docstring)."""
  body = command
  found = re.search(r"\s+#[^\"']*$", command)
  if found:  # A comment for the reader; flags go before it.
    body = command[:found.start()]
  if body.startswith(QUICK_START_INSTALL):
    body = body[len(QUICK_START_INSTALL):]
  background = body.rstrip().endswith("&") and not body.rstrip().endswith(
      "&&")
  if background:
    body = body.rstrip()[:-1].rstrip()
  extra = ""
  if re.search(r"(^|[\s/])train\.py\b", body) and (
      "trainer.train_steps" not in body):
    extra = f" --gin_param=trainer.train_steps={TRAIN_STEPS}"
  for script_name, flags in SHORTER.items():
    if script_name in body:
      extra = " " + flags
  return body + extra + (" &" if background else "")


def _script(block: Block) -> str:
  """The bash script that runs a command block."""
  text = block.text
  if block.language == "console":
    text = "\n".join(l[2:] for l in _logical_lines(text)
                     if l.startswith("$ "))
  lines = [shorten(l) for l in _logical_lines(text) if l.strip()]
  script = "\n".join(lines).replace("/path/to/", REPO_ROOT + "/")
  waits = ('status=$?\nfor job in $(jobs -p); do wait "$job" || status=$?; '
           'done\nexit "$status"')
  head = "set -e\n" if block.language != "console" else ""
  return f"{head}{script}\n{waits}\n"


def _logical_lines(text: str) -> List[str]:
  return text.replace("\\\n", " ").split("\n")


def _expected_output(block: Block) -> List[str]:
  if block.language != "console":
    return []
  return [l for l in _logical_lines(block.text)
          if l.strip() and not l.startswith("$ ")]


def _repository_copy(directory: str) -> None:
  ignore = shutil.ignore_patterns(".git", ".venv", "site", "runs",
                                  "__pycache__", "*.egg-info", "metrics.png")
  for name in os.listdir(REPO_ROOT):
    source = os.path.join(REPO_ROOT, name)
    if name in (".git", ".venv", "site", "runs") or name.endswith(
        ".egg-info"):
      continue
    if os.path.isdir(source):
      shutil.copytree(source, os.path.join(directory, name), ignore=ignore)
    else:
      shutil.copy2(source, os.path.join(directory, name))
  os.symlink(sys.prefix, os.path.join(directory, ".venv"))


def runnable_pages() -> List[str]:
  return [page for page in pages() if any(_runs(b) for b in blocks(page))]


def _runs(block: Block) -> bool:
  return (block.language in SHELL + ("python",) and not block.not_run and
          not block.run_by and not block.file_name)


@pytest.mark.slow
@pytest.mark.parametrize("page", runnable_pages())
def test_the_page_runs_as_written(page, tmp_path):
  user_dir, repo_dir = tmp_path / "project", tmp_path / "repository"
  user_dir.mkdir()
  _repository_copy(str(repo_dir))
  for name, text in _page_files(page).items():
    (user_dir / name).write_text(text)
    (repo_dir / name).write_text(text)
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
             PATH=os.path.dirname(sys.executable) + os.pathsep +
             os.environ.get("PATH", ""))
  env.pop("PYTHONPATH", None)
  for block in blocks(page):
    if not _runs(block):
      continue
    if block.language == "python":
      command = [sys.executable, "-c", textwrap.dedent(block.text)]
      cwd = str(repo_dir)
    else:
      cwd = str(user_dir if "/path/to/" in block.text else repo_dir)
      command = ["bash", "-c", _script(block)]
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=BLOCK_TIMEOUT, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == block.exit_code, (
        f"{block.name} exited {result.returncode}, not {block.exit_code}:\n"
        f"{command[-1]}\n{output[-4000:]}")
    lines = output.splitlines()
    for expected in _expected_output(block):
      pattern = output_pattern(expected)
      assert any(pattern.search(line) for line in lines), (
          f"{block.name}: no line of the output matches {expected!r}:\n"
          f"{output[-4000:]}")


def test_shortening_follows_the_docstring():
  assert shorten("python train.py --gin_file=a.gin --model_dir=r &") == (
      "python train.py --gin_file=a.gin --model_dir=r "
      f"--gin_param=trainer.train_steps={TRAIN_STEPS} &")
  assert shorten("python train.py --gin_param=trainer.train_steps=9") == (
      "python train.py --gin_param=trainer.train_steps=9")
  assert shorten(QUICK_START_INSTALL + ".venv/bin/python train.py") == (
      f".venv/bin/python train.py --gin_param=trainer.train_steps="
      f"{TRAIN_STEPS}")
  assert shorten("python scripts/benchmark.py   # one_device") == (
      "python scripts/benchmark.py --rounds=1 --steps=100")
  assert output_pattern("step  600/1000 | loss 0.0045 | ...").search(
      "step 100/200 | loss 1.5e-05 | ETA 0s")


def test_blocks_are_mostly_run():
  runnable = [b for b in all_blocks() if b.language in RUNNABLE]
  marked = [b for b in runnable if b.not_run]
  assert len(marked) < len(runnable) / 2, [b.name for b in marked]

