"""A Python process that loads TensorFlow before it is told what to run.

A new sweep's checks end with `train.py --dry_run` (`sweeps.checks`), and
both it and the sweep itself spend their first seconds importing
TensorFlow: one after the other, that was 3.4 s of the sweep's start. So
`scripts/sweep.py` starts this process first, before its own imports, and
hands it the dry run's command once the flags are parsed: the two imports
run at once, on two cores. Standard library only, so that starting it costs
nothing.
"""

import atexit
import json
import os
import subprocess
import sys
from typing import List, Optional, Sequence

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Imports the framework (and with it TensorFlow), then runs the script and
# arguments of the first line of stdin as `python SCRIPT ARGS` would; ends
# quietly when stdin closes first (the sweep needed no dry run).
_PRELUDE = (
    "import json, runpy, sys\n"
    "sys.path.insert(0, sys.argv[1])\n"
    "import trainer  # noqa: F401\n"
    "line = sys.stdin.readline()\n"
    "if not line: sys.exit(0)\n"
    "sys.argv = json.loads(line)\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n")

# Flags after which no dry run is run, or not by this process (under a
# launcher the dry run is the launcher's process).
_NO_DRY_RUN = ("--report", "--help", "-h", "--helpfull", "--launcher")


class WarmPython:
  """A Python process with TensorFlow loaded (or loading), waiting for a
  command; killed at exit unless it was given one."""

  def __init__(self):
    self._given = False
    self._process = subprocess.Popen(
        [sys.executable, "-c", _PRELUDE, REPO_ROOT], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"))
    atexit.register(self.close)

  def run(self, argv: Sequence[str]) -> subprocess.Popen:
    """Runs `argv` (`[script, arg, ...]`) in the process; returns it, its
    output (stdout and stderr) a pipe."""
    self._given = True
    self._process.stdin.write(json.dumps(list(argv)) + "\n")
    self._process.stdin.close()
    self._process.stdin = None  # So that `communicate` reads only.
    return self._process

  def close(self) -> None:
    """Ends the process if it was never given a command."""
    if not self._given and self._process.poll() is None:
      self._process.kill()
      self._process.communicate()
      self._given = True  # Closed: once is enough.


def start(argv: List[str]) -> Optional[WarmPython]:
  """Starts a `WarmPython` for the dry run, unless `argv` (the sweep's)
  asks for none or for one under a launcher."""
  if any(arg.split("=", 1)[0] in _NO_DRY_RUN for arg in argv[1:]):
    return None
  return WarmPython()
