"""Every file operation on a run's paths goes through `trainer.storage.files`.

A model_dir, sweep_dir, data dir or config path may be a URL (`gs://...`):
`os.*`, `open`, `glob`, `shutil` and `tempfile` would take it for a local
folder named `gs:` (issue 52). So outside `trainer/storage/files.py` no code
of the framework, the shipped Tasks or the scripts calls them, nor
`tf.io.gfile`, except on a line that says why its path is always local:
`# local-path: <why>` (the repository's own files, a process's scratch, a
lock that needs a local file system). A script that only ever works in
folders it made itself says so once at its top: `# local-paths-only: <why>`.
"""

import ast
import os
import re

import pytest

from trainer.storage import files

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
_CHECKED = ("trainer", "tasks", "scripts", "train.py")
_LAYER = os.path.join("trainer", "storage", "files.py")
# `os` and `os.path` names that touch the file system, or rewrite a URL
# (`os.path.abspath("gs://b")` is `<cwd>/gs:/b`).
_OS_CALLS = {
    "access", "chmod", "chown", "fchmod", "fsync", "listdir", "lstat",
    "makedirs", "mkdir", "open", "remove", "removedirs", "rename", "renames",
    "replace", "rmdir", "scandir", "stat", "truncate", "unlink", "utime",
    "walk", "mkfifo",
}
_OS_PATH_CALLS = {
    "abspath", "exists", "getatime", "getctime", "getmtime", "getsize",
    "isdir", "isfile", "islink", "ismount", "lexists", "normpath",
    "realpath", "relpath", "samefile",
}
_MODULES = {"glob", "shutil", "tempfile"}
_EXEMPT_LINE = re.compile(r"#\s*local-path:\s*\S")
_EXEMPT_FILE = re.compile(r"^#\s*local-paths-only:\s*\S", re.MULTILINE)


def _python_files():
  for entry in _CHECKED:
    path = os.path.join(REPO_ROOT, entry)
    if entry.endswith(".py"):
      yield entry
      continue
    for directory, _, names in os.walk(path):
      for name in names:
        if name.endswith(".py"):
          yield os.path.relpath(os.path.join(directory, name), REPO_ROOT)


def _dotted(node):
  """`a.b.c` of an attribute chain, or None."""
  parts = []
  while isinstance(node, ast.Attribute):
    parts.append(node.attr)
    node = node.value
  if isinstance(node, ast.Name):
    parts.append(node.id)
    return ".".join(reversed(parts))
  return None


def file_operations(source: str):
  """The `(line, call)` of each file operation in `source` that bypasses
  the file layer."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Call):
      name = _dotted(node.func)
      if name is None:
        continue
      parts = name.split(".")
      if (name == "open" or
          (parts[0] == "os" and len(parts) == 2 and parts[1] in _OS_CALLS) or
          (parts[:2] == ["os", "path"] and len(parts) == 3 and
           parts[2] in _OS_PATH_CALLS) or
          (parts[0] in _MODULES and len(parts) >= 2) or
          "gfile" in parts[:-1]):
        found.append((node.lineno, name))
  return found


def _violations(relative):
  with open(os.path.join(REPO_ROOT, relative), encoding="utf-8") as f:
    source = f.read()
  if _EXEMPT_FILE.search(source):
    return []
  lines = source.splitlines()
  return [f"{relative}:{line}: {call}"
          for line, call in file_operations(source)
          if not _EXEMPT_LINE.search(lines[line - 1])]


def test_no_file_operation_bypasses_the_layer():
  violations = [v for relative in sorted(_python_files())
                if relative != _LAYER for v in _violations(relative)]
  assert not violations, (
      "file operations outside trainer/storage/files.py (use it, or say "
      "`# local-path: <why>` on the line):\n" + "\n".join(violations))


def test_the_check_finds_each_kind_of_call():
  source = "\n".join([
      "open(p)", "os.listdir(p)", "os.path.exists(p)", "os.path.abspath(p)",
      "glob.glob(p)", "shutil.rmtree(p)", "tempfile.mkdtemp()",
      "tf.io.gfile.exists(p)", "os.path.join(p, q)", "os.environ.get(k)",
      "os.path.basename(p)", "files.exists(p)"])
  assert [call for _, call in file_operations(source)] == [
      "open", "os.listdir", "os.path.exists", "os.path.abspath", "glob.glob",
      "shutil.rmtree", "tempfile.mkdtemp", "tf.io.gfile.exists"]


@pytest.mark.parametrize("path", ["gs://bucket/run", "ram://bucket/run"])
def test_string_path_operations_keep_a_url(path):
  """What the check lets through (`os.path.join`, `dirname`, `basename`)
  keeps a URL whole; `absolute` does too."""
  child = os.path.join(path, "eval", "evaluated.json")
  assert child == path + "/eval/evaluated.json"
  assert os.path.dirname(os.path.dirname(child)) == path
  assert os.path.basename(child) == "evaluated.json"
  assert files.absolute(path) == path
