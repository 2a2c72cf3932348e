"""The one channel for lines for the person running training, also kept in
the log.

`train.py` tells what happens one line at a time on stdout
(`train | step ...`, `best | ...`, `warning | ...`), flushed so that a
launcher's log shows each line at once. absl's log gets the same text when
it goes to a file; when it goes to the terminal (absl's default, stderr)
the line is printed only, so it shows once.

On an interactive terminal the training progress is one status line
redrawn in place (`status`, the progress bar); every other line is printed
above it, and it is drawn again below. Where stdout is not a terminal (a
log file, a SLURM job) nothing is redrawn: `status` is never called.

`log` is the channel for lines kept in the log but not printed (what was
built, where a file went): absl INFO, which `train.py` hides unless
`--verbosity` asks for it (`configure`). No other module of the framework
calls absl's logging, except the TensorFlow-log plumbing (`tf_logs`).
"""

import contextlib
import shutil
import sys
from typing import Callable, Iterator, List, Optional, Sequence

from absl import logging

# Info lines held back by `held`, in order; None when none are.
_held: Optional[List[str]] = None
# The status line shown on the terminal (the progress bar); None: none.
_status: Optional[str] = None
# Erases the terminal's current line: back to its start, then clear it.
_ERASE = "\r\x1b[K"


def _log_reaches_terminal() -> bool:
  """Whether absl's log goes to stderr, where the printed line shows too."""
  handler = logging.get_absl_handler().python_handler
  return getattr(handler, "stream", None) in (sys.stderr, sys.__stderr__)


def configure(verbosity_asked: bool, errors_only: bool = False) -> None:
  """Sets what the log keeps: where absl's `--verbosity` was not given,
  warnings and errors only (`errors_only`: errors only).

  The lines `info` prints would otherwise show twice on a terminal, the
  log's copy beside the printed one; INFO lines (`log`'s) are then kept only
  when `--verbosity` asks for them. The scripts configure it here too.
  """
  if not verbosity_asked:
    logging.set_verbosity(logging.ERROR if errors_only else logging.WARNING)


def log(message: str) -> None:
  """Logs `message` at INFO, and prints nothing.

  For lines kept in the log but not said to the person running training
  (the strategy built, a file written): `train.py` logs INFO only when
  `--verbosity` asks (`configure`).
  """
  logging.info(message)


# The log names the line of `log`'s caller, as when it called absl itself.
logging.ABSLLogger.register_frame_to_skip(__file__, log.__name__)


def info(message: str) -> None:
  """Prints `message` and logs it at INFO (or holds it: see `held`)."""
  if _held is not None:
    _held.append(message)
    return
  _print(message)


def waiting(message: str) -> None:
  """Prints `message` and logs it at INFO now, even inside `held`.

  For the lines that say the process waits (for a cluster's tasks, say)
  and when the wait ends: held with the build's other lines, they would
  show only once the wait is over, after minutes of silence, or never if
  a signal ends the process during it.
  """
  _print(message)


def _print(message: str) -> None:
  if not _log_reaches_terminal():
    logging.info(message)
  _write_above_status(message)


def _write_above_status(message: str) -> None:
  """Prints `message` above the status line, which is then drawn again."""
  if _status is not None:
    sys.stdout.write(_ERASE)
    sys.stdout.flush()
  print(message, flush=True)
  if _status is not None:
    sys.stdout.write(_status)
    sys.stdout.flush()


def interactive() -> bool:
  """Whether stdout is an interactive terminal (where `status` belongs)."""
  try:
    return sys.stdout.isatty()
  except (AttributeError, ValueError):  # Replaced, or closed.
    return False


def columns() -> int:
  """The terminal's width in characters (80 where it does not say)."""
  return shutil.get_terminal_size().columns  # local-path: no path at all


def status(message: str, log: Optional[str] = None) -> None:
  """Shows `message` as the status line, in place of the last one; on an
  interactive terminal only.

  Cut to the terminal's width, since a wrapped line cannot be redrawn in
  place. The log gets `log` (the line a terminal would not show) where it
  does not go to the terminal.
  """
  global _status
  if log is not None and not _log_reaches_terminal():
    logging.info(log)
  _status = message[:max(columns() - 1, 20)]
  sys.stdout.write(_ERASE + _status)
  sys.stdout.flush()


def end_status() -> None:
  """Keeps the status line shown as a line of its own; the next status line
  starts below it."""
  global _status
  if _status is not None:
    _status = None
    print(flush=True)


@contextlib.contextmanager
def held() -> Iterator[Callable[[Sequence[str]], None]]:
  """A block whose info lines wait for the function it yields, `release(
  first=())`, which prints the lines `first`, then those held, and ends the
  wait; the block's end releases them too, after an error as well.

  For what is said while a run is built (the optimizers, the checkpoint
  restored), which belongs after the run's header, known only once built.
  Warnings, errors and `waiting`'s lines are never held.
  """
  global _held
  if _held is not None:  # Within another held block, which releases.
    yield lambda first=(): [info(line) for line in first]
    return
  _held = []

  def release(first: Sequence[str] = ()) -> None:
    global _held
    lines, _held = _held, None
    for line in [*first, *(lines or ())]:
      info(line)

  try:
    yield release
  finally:
    release()


def error(message: str) -> None:
  """Prints `message` on stderr and logs it at ERROR.

  For a failed run's last line (and the traceback asked for before it),
  which a launcher reads on stderr.
  """
  if not _log_reaches_terminal():
    logging.error(message)
  end_status()  # A failed run's bar stays as it was, above the error.
  print(message, file=sys.stderr, flush=True)


def warning(message: str) -> None:
  """Prints `warning | message` and logs `message` at WARNING."""
  if not _log_reaches_terminal():
    logging.warning(message)
  _write_above_status(f"warning | {message}")
