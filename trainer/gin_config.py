"""The configuration: gin files and bindings in, the configured Task,
runtime and trainer settings out, every problem one line.

Gin files are found in the working directory or in this repository, or
read from a URL (`--gin_file=gs://bucket/exp.gin`); a local gin file may
`import` a user's module kept in the working directory or beside it.
Errors keep gin's file and line, and unknown names get a did-you-mean.
"""

import contextlib
import difflib
import inspect
import logging as std_logging
import os
import re
import sys
from typing import List, Sequence, Tuple

import gin

from trainer import config as config_lib
from trainer import errors
from trainer import experiment  # noqa: F401  Registers what a run configures.
from trainer import model_garden  # Registers `model_garden_task`.
from trainer import runtime as runtime_lib
from trainer import user_errors
from trainer.model import task as task_lib
from trainer.storage import files

REPO_ROOT = os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))  # local-path: this repository


def _is_gin_file_at_url(path: str) -> bool:
  return files.is_url(path) and files.isfile(path)


# Gin reads files with `open`, which takes `gs://b/x.gin` for a local path:
# a gin file (or an `include`) at a URL is read through the file layer, as
# `gin.tf` registers `tf.io.gfile` (it cannot be imported on TF 2.20).
gin.config.register_file_reader(files.open_file, _is_gin_file_at_url)


@gin.configurable("experiment")
def configured_task(task: task_lib.Task = gin.REQUIRED) -> task_lib.Task:
  """Returns the Task bound as `experiment.task = @SomeTask()`.

  Args:
    task: The Task instance to run, e.g. `@DigitsClassification()`.
  """
  if inspect.isclass(task) and issubclass(task, task_lib.Task):
    raise errors.ConfigError(
        f"`experiment.task = @{task.__name__}` passes the class; write "
        f"`@{task.__name__}()` to pass an instance.")
  if not isinstance(task, task_lib.Task):
    raise errors.ConfigError(f"`experiment.task` must be a trainer.Task, got "
                             f"{type(task).__name__}.")
  return task


def _registered_configurables() -> List[str]:
  registry = getattr(gin.config, "_REGISTRY", None)
  return sorted(name for name, _ in registry.items()) if registry else []


def _parameter_names(configurable_name: str) -> List[str]:
  registry = getattr(gin.config, "_REGISTRY", None)
  try:
    wrapped = registry.get_match(configurable_name).wrapped
    target = wrapped.__init__ if inspect.isclass(wrapped) else wrapped
    return [p for p in inspect.signature(target).parameters if p != "self"]
  except Exception:  # Suggestions are best effort only.
    return []


def _suggestion(message: str) -> str:
  """Returns ' (did you mean ...?)' for an unknown gin name, or ''."""
  candidates, wrong = [], None
  match = (re.search(r"No configurable matching '([^']+)'", message) or
           re.search(r"No configurable matching reference '@([^'(]+)", message))
  if match:
    wrong = match.group(1)
    names = _registered_configurables()
    # Compare like with like: bare names against bare names.
    candidates = names + [n.rsplit(".", 1)[-1] for n in names]
  match = re.search(
      r"Configurable '([^']+)' doesn't have a parameter named '([^']+)'",
      message)
  if match:
    wrong = match.group(2)
    candidates = _parameter_names(match.group(1))
  close = difflib.get_close_matches(wrong, candidates, n=1) if wrong else []
  return f" (did you mean '{close[0]}'?)" if close else ""


def _config_location(error: BaseException) -> str:
  """`file.gin:line: ` or `--gin_param: ` where gin says `error` came from
  (it appends that to the message), else ''."""
  for line in str(error).splitlines()[1:]:
    found = re.match(r'\s*In file "([^"]+)", line (\d+)', line)
    if found:
      return f"{found.group(1)}:{found.group(2)}: "
    if re.match(r"\s*In bindings string line (\d+)", line):
      return "--gin_param: "
  return ""


def _one_line(error: BaseException) -> str:
  """Condenses a gin or validation error to `location: problem`."""
  if isinstance(error, SyntaxError):
    text = (error.msg or "").split(" (line")[0].rstrip(".")
    bare = re.search(r"Failed to parse token '([\w.]+)'", text)
    if text.startswith("malformed node or string") and bare:
      # `x = MyTask()`: gin values are literals or `@references`.
      text = (f"`{bare.group(1)}` is not a value: write `@{bare.group(1)}()` "
              "for an instance of a configurable, or quote a string")
    if (error.filename or "").endswith(".py"):  # A module the config imports.
      module = os.path.splitext(os.path.basename(error.filename))[0]
      where = f"{user_errors.display_path(error.filename)}:{error.lineno}"
      return (f"{_config_location(error)}in {module} ({where}, at import): "
              f"Python syntax error: {text}")
    if error.filename:
      return f"{error.filename}:{error.lineno}: gin syntax error: {text}"
    where = f" in {error.text.strip()!r}" if (error.text or "").strip() else ""
    return f"--gin_param: gin syntax error: {text}{where}"
  message = str(error).strip() or type(error).__name__
  lines = [line.strip() for line in message.splitlines() if line.strip()]
  location = _config_location(error)
  problem = lines[0] if lines else message
  if isinstance(error, ImportError):
    problem = f"cannot import: {problem}"
  if "Required bindings for `experiment`" in problem:
    problem = ("no task configured: bind `experiment.task = @SomeTask()` in a "
               "gin file")
  suggestion = _suggestion(message)
  if suggestion:
    problem = problem.rstrip(".")
  return f"{location}{problem}{suggestion}"


def load_config(gin_files: Sequence[str], gin_params: Sequence[str]
                ) -> Tuple[task_lib.Task, runtime_lib.RuntimeConfig,
                           config_lib.TrainerConfig]:
  """Parses gin and builds every configured object, validating each.

  Raises:
    errors.ConfigError: With a one-line description of the first problem.
  """
  gin.add_config_file_search_path(REPO_ROOT)
  if not gin_files:
    raise errors.ConfigError(
        "no --gin_file given; try --gin_file=gin/digits.gin")
  found = [_find_gin_file(path) for path in gin_files]
  # Gin files may `import` a user's module kept in the working directory or
  # beside the gin file (not at a URL: Python imports nothing from there),
  # and name repository configs (`gin/digits.gin`) from anywhere.
  module_dirs = [os.getcwd()] + [
      os.path.dirname(path) for path in found
      if not files.is_url(path) and
      not path.startswith(os.path.join(REPO_ROOT, "gin", ""))]
  for directory in reversed(list(dict.fromkeys(module_dirs))):
    if directory not in sys.path:
      sys.path.insert(0, directory)
  try:
    with _quiet_package_lookups(), _includes_beside(found):
      gin.parse_config_files_and_bindings(gin_files, gin_params,
                                          skip_unknown=False)
    task = configured_task()
    # Built from gin; a Model Garden experiment's settings meet gin's here,
    # once, before either is checked.
    runtime, config = model_garden.settle(task)
    return task, runtime, config
  except Exception as e:  # Gin re-raises the user's errors with context.
    message = _one_line(e)
    # A `ConfigError` is already the one line to show, wherever it was
    # raised (a shipped Task's checks of its arguments, a user's own).
    if (user_errors.in_user_code(e) and
        not isinstance(e, errors.ConfigError)):
      # Raised by the user's module as gin imported it, or by a configurable
      # of theirs: its type, file and line, after the config's line.
      raise errors.ConfigError(
          f"{_config_location(e)}{user_errors.describe(e)}") from e
    if isinstance(e, ModuleNotFoundError):
      message += (" (looked in the working directory and beside the gin "
                  f"files: {', '.join(dict.fromkeys(module_dirs))}; or add "
                  "its directory to PYTHONPATH)")
    raise errors.ConfigError(message) from e


class _PackageLookupFilter(std_logging.Filter):
  """Drops gin's "Path not found" records: it logs one at ERROR each time
  it tries a path such as `gin/runtime/x.gin` as a Python package (module
  `gin.runtime`), before it finds the file under a search path."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    return not (record.getMessage().startswith("Path not found: ") and
                record.pathname.endswith("resource_reader.py"))


@contextlib.contextmanager
def _quiet_package_lookups():
  """A block in which gin's failed package lookups are not logged."""
  quiet = _PackageLookupFilter()
  # gin logs them on the root logger itself (`logging.error`).
  root = std_logging.getLogger()
  root.addFilter(quiet)
  try:
    yield
  finally:
    root.removeFilter(quiet)


@contextlib.contextmanager
def _includes_beside(gin_files: Sequence[str]):
  """A block in which an `include` is found as a --gin_file is, then beside
  one of `gin_files`: a config kept with its base (`gs://b/configs/exp.gin`
  including 'base.gin') needs neither a working directory nor a full path.

  Gin tries its search paths in order (this repository stays before these)
  and keeps them for the process: they are put back after the block, so a
  second config loaded in one process (tests, a sweep's checks) finds
  nothing beside the first one's files.
  """
  # Gin has no call that removes a search path: its list, kept as it was.
  prefixes = gin.config._LOCATION_PREFIXES  # pylint: disable=protected-access
  kept = list(prefixes)
  for directory in dict.fromkeys(os.path.dirname(path) for path in gin_files):
    gin.add_config_file_search_path(directory)
  try:
    yield
  finally:
    prefixes[:] = kept


def _find_gin_file(path: str) -> str:
  """Returns the absolute path of `path`, relative to the working directory
  or to this repository; a URL as it is.

  Raises:
    errors.ConfigError: If it is neither, or a URL this process cannot read
      (`gs:/one-slash`, `s3://`).
  """
  files.check_path(path, "--gin_file")
  for base in ("",) if files.is_url(path) else ("", REPO_ROOT):
    candidate = os.path.join(base, path)
    if files.isfile(candidate):
      return files.absolute(candidate)
    if files.isdir(candidate):
      raise errors.ConfigError(f"--gin_file: {path} is a directory, not a "
                               "gin file.")
  raise errors.ConfigError(f"--gin_file: no such file: {path}")
