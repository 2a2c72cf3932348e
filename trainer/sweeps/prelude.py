"""The program of a Python process a sweep starts ahead (`warm.WarmPython`).

Run as a script, `python prelude.py REPO PARENT`, with the standard library
only until it imports the framework:

  REPO    the repository, put first on `sys.path` (in place of this
          script's own folder, whose module names are the sweep's);
  PARENT  the sweep's pid, or 0. With a pid (on Linux), the process gets
          SIGTERM when the sweep thread that started it dies, even by
          SIGKILL, so a trial checkpoints and exits instead of training on
          unwatched and holding its model_dir's lease against the rerun
          that resumes it.

It blocks the signals `train.py` blocks (its handlers take them once in
place), imports the framework and TensorFlow (a failure is written to the
run's output once the command names it), then reads its command,
`{"argv": [SCRIPT, ARG, ...], "log": PATH or null}`, from stdin, sends its
output to the log if one is named, and runs the script as
`python SCRIPT ARG ...` would. It ends quietly if stdin closes first.
"""

import sys

# First, before any import could find a module of this folder by its name.
sys.path[0] = sys.argv[1]

# pylint: disable=g-import-not-at-top,wrong-import-position
import ctypes
import json
import os
import runpy
import signal
import traceback

_PR_SET_PDEATHSIG = 1


def main() -> None:
  # Held, as train.py holds them, until its handlers are in place.
  signal.pthread_sigmask(signal.SIG_BLOCK,
                         {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1})
  parent = int(sys.argv[2])
  if parent:
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # The sweep died before the call above.
      os._exit(143)
  try:
    # What train.py imports: TensorFlow and the framework's whole stack
    # (`import trainer` alone loads neither).
    from trainer import cli  # pylint: disable=unused-import
    failure = None
  except BaseException:  # pylint: disable=broad-except
    failure = traceback.format_exc()
  line = sys.stdin.readline()
  if not line:
    os._exit(0)
  command = json.loads(line)
  if command["log"]:
    # A local file: a trial's log under a URL model_dir is kept locally
    # while it runs (`trial_run.TrialProcess`).
    log = os.open(  # local-path: see above
        command["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
  if failure:  # Said where the run's output goes.
    sys.stderr.write(failure)
    sys.stderr.flush()
    os._exit(1)
  sys.argv = command["argv"]
  runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
  main()
