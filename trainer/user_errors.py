"""One line for an exception raised by a Task's own code during a run.

A mistake in a hook shows up either while TensorFlow traces it (autograph
wraps it in an "in user code:" message of a dozen framework frames) or while
a step runs (an `OpError` whose first line is "Graph execution error:", with
the real cause and the Python stack that defined the failing op further down).
`describe` turns either into

    in MyTask.build_losses (my_task.py:28): TypeError: Input 'y' of ...

naming the innermost frame of the user's own code, the Task hook it is in and
the cause, without the frames of TensorFlow, Keras, Orbit or this framework
(as Keras filters its own). `TRAINER_FULL_TRACEBACK=1` (or `train.py
--full_traceback`) asks for the full traceback as well.
"""

import ast
import dataclasses
import functools
import os
import re
import sys
import sysconfig
import traceback
from typing import Iterator, List, Optional, Sequence, Tuple

FULL_TRACEBACK_ENV = "TRAINER_FULL_TRACEBACK"

# `trainer.Task`'s hooks (tests check this against the class).
HOOKS = frozenset([
    "build_model", "build_inputs", "preprocess_batch", "build_losses",
    "build_metrics", "create_optimizer", "initialize", "export_signatures",
    "process_metrics", "train_step", "compute_gradients", "validation_step",
    "aggregate_logs", "reduce_aggregated_logs", "mixture_rates"])

# Paths of source files (this package's, a traceback's): local by
# construction, as Python imported them from there.
_PACKAGE_DIR = os.path.dirname(
    os.path.abspath(__file__))  # local-path: this package's source
_REPO_ROOT = os.path.dirname(_PACKAGE_DIR)
_TASK_FILE = os.path.join(_PACKAGE_DIR, "model", "task.py")
_FRAMEWORK_PATHS = (_PACKAGE_DIR + os.sep, os.path.join(_REPO_ROOT, "train.py"),
                    os.path.join(_REPO_ROOT, "scripts") + os.sep)
_LIBRARIES = ("tensorflow", "tf_keras", "keras", "orbit", "official", "absl",
              "gin", "numpy")
_MAX_CAUSE = 300

_FRAME = re.compile(r'^(\s*)File "([^"]+)", line (\d+), in (\S+)')
_NODE_DEFINED = re.compile(r"^\s*Detected at node .* defined at \(most recent "
                           r"call last\):\s*$")
_NOISE_LINES = re.compile(
    r"^\s*(Graph execution error:|\d+ root error\(s\) found\.|"
    r"\d+ successful operations\.|\d+ derived errors ignored\.|"
    r"<stack traces unavailable>|Traceback \(most recent call last\):)\s*$")
_NOISE = [
    re.compile(r"\s*\[\[.*?\]\]"),  # [[{{node x}}]], [[while/IteratorGetNext]]
    re.compile(r"\s*\[Op:[^\]]*\]"),  # [Op:__inference_loop_718]
    re.compile(r"\{\{function_node [^}]*\}\}\s*"),
    re.compile(r"^\s*\(\d+\) [A-Z_]+:\s*"),  # (0) INVALID_ARGUMENT:
    # A graph node's definition, inside a shape error.
    re.compile(r" for '\{\{node [^}]*\}\}[^']*'"),
]
_KERAS_LAYER = re.compile(
    r"Exception encountered when calling layer ('[^']*' \(type [^)]*\))\.")


@dataclasses.dataclass(frozen=True)
class Frame:
  """One frame of a stack: where the code is and its function's name."""
  filename: str
  lineno: int
  name: str


def full_traceback_requested() -> bool:
  """Whether `TRAINER_FULL_TRACEBACK` asks for full tracebacks."""
  value = os.environ.get(FULL_TRACEBACK_ENV, "").strip().lower()
  return value not in ("", "0", "false", "no")


@functools.lru_cache(maxsize=None)
def _library_paths() -> tuple:
  paths = {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib")}
  for name in _LIBRARIES:
    module = sys.modules.get(name)
    for path in getattr(module, "__path__", None) or []:
      paths.add(path)
  return tuple(os.path.join(os.path.realpath(p), "")  # local-path: sources
               for p in paths if p)


def is_user_file(filename: str) -> bool:
  """Whether `filename` holds the user's code, not a library's or ours."""
  if filename.startswith("<") or "__autograph_generated_file" in filename:
    return False
  path = os.path.abspath(filename)  # local-path: a source file's name
  if path.startswith(_FRAMEWORK_PATHS):
    return False
  parts = path.split(os.sep)
  if "site-packages" in parts or "dist-packages" in parts:
    return False
  real = os.path.realpath(path)  # local-path: a source file's name
  return not real.startswith(_library_paths())


def _chain(error: BaseException) -> Iterator[BaseException]:
  """`error`, then what it was raised from or while handling."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    yield error
    error = error.__cause__ or error.__context__


def _message(error: BaseException) -> str:
  message = getattr(error, "message", None)
  return message if isinstance(message, str) else str(error)


def _message_frames(message: str) -> List[Frame]:
  """The frames an autograph or `OpError` message lists, outermost first."""
  frames = []
  for line in message.splitlines():
    found = _FRAME.match(line)
    if found:
      frames.append(Frame(found.group(2), int(found.group(3)),
                          found.group(4)))
  return frames


def _traceback_frames(error: BaseException) -> List[Frame]:
  # Autograph's copy of `f` is `tf__f`, in a generated file.
  return [Frame(f.filename, f.lineno or 0, f.name.replace("tf__", "", 1))
          for f in traceback.extract_tb(error.__traceback__)]


def _stacks(error: BaseException) -> Iterator[List[Frame]]:
  """Each stack that may lead to the user's code, the most precise first.

  An op's or autograph's message names the frames that built the graph;
  the Python traceback of a traced function only has autograph's generated
  files, so it comes second.
  """
  for link in _chain(error):
    yield _message_frames(_message(link))
    yield _traceback_frames(link)


def _user_code(error: BaseException
               ) -> Optional[Tuple[List[Frame], int]]:
  """Returns `(stack, i)`: `stack[i]` is the innermost frame of the user's
  code behind `error`; None if there is none."""
  for stack in _stacks(error):
    for i in range(len(stack) - 1, -1, -1):
      if is_user_file(stack[i].filename):
        return stack, i
  return None


@functools.lru_cache(maxsize=64)
def _syntax_tree(filename: str) -> Optional[ast.AST]:
  try:
    with open(filename, encoding="utf-8") as f:  # local-path: source code
      return ast.parse(f.read(), filename)
  except (OSError, SyntaxError, ValueError):
    return None


_SCOPES = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _scopes_at(node: ast.AST, lineno: int) -> List[ast.AST]:
  """The deepest chain of classes and functions under `node` that holds line
  `lineno`, outermost first."""
  deepest = []
  for child in ast.iter_child_nodes(node):
    start = getattr(child, "lineno", None)
    if start is not None and not start <= lineno <= child.end_lineno:
      continue
    chain = _scopes_at(child, lineno)
    if isinstance(child, _SCOPES):
      chain = [child] + chain
    if len(chain) > len(deepest):
      deepest = chain
  return deepest


def _enclosing_names(filename: str, lineno: int) -> List[str]:
  """The classes and functions around line `lineno`, outermost first."""
  tree = _syntax_tree(filename)
  return [getattr(scope, "name", "<lambda>")
          for scope in (_scopes_at(tree, lineno) if tree else [])]


def display_path(filename: str) -> str:
  """`filename` relative to the working directory where it lies below it."""
  relative = os.path.relpath(os.path.abspath(filename))  # local-path: source
  return filename if relative.startswith(os.pardir) else relative


def _place(stack: Sequence[Frame], i: int) -> str:
  """Returns `Class.hook (file:line)` for the user's frame `stack[i]`, or
  `function (file:line, called from hook)` when the function is not written
  inside a hook."""
  frame = stack[i]
  where = f"{display_path(frame.filename)}:{frame.lineno}"
  names = _enclosing_names(frame.filename, frame.lineno) or [frame.name]
  if names == ["<module>"]:  # Raised while the module is imported.
    module = os.path.splitext(os.path.basename(frame.filename))[0]
    return f"{module} ({where}, at import)"
  for j in range(len(names) - 1, -1, -1):
    if names[j] in HOOKS:
      return f"{'.'.join(names[max(0, j - 1):j + 1])} ({where})"
  callers = [f.name for f in stack[:i] if f.name in HOOKS]
  if callers:
    where += f", called from {callers[-1]}"
  return f"{'.'.join(names[-2:])} ({where})"


def _after_last_frame(message: str) -> str:
  """What follows the last stack frame `message` lists (with its source
  lines): the innermost error of an autograph message, the cause of an
  `OpError` after the stack that defined the op."""
  lines = message.splitlines()
  last = max((i for i, line in enumerate(lines) if _FRAME.match(line)),
             default=None)
  if last is None:
    return message
  indent = len(_FRAME.match(lines[last]).group(1))
  rest = lines[last + 1:]
  while rest and (not rest[0].strip() or
                  len(rest[0]) - len(rest[0].lstrip()) > indent):
    rest = rest[1:]
  return "\n".join(rest)


# The first line of what gin appends to an error raised under it.
_GIN_CONTEXT = re.compile(
    r"\n\s*In (?:file \"|call to configurable|bindings string line)")


def _one_line(text: str) -> str:
  text = " ".join(text.split())
  if len(text) <= _MAX_CAUSE:
    return text
  return text[:_MAX_CAUSE].rsplit(" ", 1)[0] + " ..."


def cause(error: BaseException) -> str:
  """Returns `Type: cause` for `error`, on one line.

  An `OpError` loses its "Graph execution error:" header, the stack that
  defined the op and the `[[{{node ...}}]]` and `[Op:...]` tags; an
  autograph error is replaced by the error the user's code raised (with its
  own type), a Keras layer's error by its cause and the layer's name.
  """
  type_name = type(error).__name__
  # Gin appends where in the config the error came from; callers say that.
  message = _GIN_CONTEXT.split(_message(error))[0]
  layer = _KERAS_LAYER.search(message)
  message = _after_last_frame(message).strip()
  # Autograph repeats the user's error as `Type: message`.
  found = re.match(r"(\w+): ", message)
  if found and (found.group(1) == type_name or
                found.group(1).endswith(("Error", "Exception"))):
    type_name, message = found.group(1), message[found.end():]
  message = _KERAS_LAYER.sub("", message)
  message = re.split(r"\s*Call arguments received by layer", message)[0]
  lines = []
  for line in message.splitlines():
    for pattern in _NOISE:
      line = pattern.sub("", line).strip()
    if (line and line not in lines and not _NOISE_LINES.match(line) and
        not _NODE_DEFINED.match(line)):
      lines.append(line)
  text = " ".join(lines)
  if layer:
    text = f"in layer {layer.group(1)}: {text}"
  text = _one_line(text)
  return f"{type_name}: {text}" if text else type_name


def _framework_hook(error: BaseException) -> Optional[str]:
  """The innermost default hook of `trainer.Task` behind `error`."""
  for stack in _stacks(error):
    for frame in reversed(stack):
      if frame.filename == _TASK_FILE and frame.name in HOOKS:
        return frame.name
  return None


def in_user_code(error: BaseException) -> bool:
  """Whether a frame of the user's code is behind `error`."""
  return _user_code(error) is not None


def describe(error: BaseException) -> str:
  """Returns `error` as one line: `in <hook> (<file>:<line>): <Type>: <cause>`
  naming the innermost frame of the user's code behind it, `in
  Task.<hook>: <Type>: <cause>` when only a default hook is, else
  `<Type>: <cause>`."""
  found = _user_code(error)
  if found:
    return f"in {_place(*found)}: {cause(error)}"
  hook = _framework_hook(error)
  return f"in Task.{hook}: {cause(error)}" if hook else cause(error)


def at_caller(message: str) -> str:
  """Returns `message` after the place of the innermost user's code on the
  stack (`in MyTask.build_model (my_task.py:4): ...`), as `describe` names
  it for an error the user's code raised; `message` alone where there is
  none (a framework call, or code autograph traces).

  For a `ConfigError` that a framework function raises for the arguments
  the user's code gave it, whose one line has no traceback.
  """
  stack = [Frame(f.filename, f.lineno or 0, f.name)
           for f in traceback.extract_stack()]
  for i in range(len(stack) - 1, -1, -1):
    if is_user_file(stack[i].filename):
      return f"in {_place(stack, i)}: {message}"
  return message


def full_traceback(error: BaseException) -> str:
  """Returns Python's full traceback of `error`, chained errors included."""
  return "".join(traceback.format_exception(type(error), error,
                                            error.__traceback__))
