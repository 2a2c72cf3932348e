"""The one channel for lines for the person running training, also kept in
the log.

`train.py` tells what happens one line at a time on stdout
(`train | step ...`, `best | ...`, `warning | ...`), flushed so that a
launcher's log shows each line at once. absl's log gets the same text when
it goes to a file; when it goes to the terminal (absl's default, stderr)
the line is printed only, so it shows once.
"""

import sys

from absl import logging


def _log_reaches_terminal() -> bool:
  """Whether absl's log goes to stderr, where the printed line shows too."""
  handler = logging.get_absl_handler().python_handler
  return getattr(handler, "stream", None) in (sys.stderr, sys.__stderr__)


def info(message: str) -> None:
  """Prints `message` and logs it at INFO."""
  if not _log_reaches_terminal():
    logging.info(message)
  print(message, flush=True)


def error(message: str) -> None:
  """Prints `message` on stderr and logs it at ERROR.

  For a failed run's last line (and the traceback asked for before it),
  which a launcher reads on stderr.
  """
  if not _log_reaches_terminal():
    logging.error(message)
  print(message, file=sys.stderr, flush=True)


def warning(message: str) -> None:
  """Prints `warning | message` and logs `message` at WARNING."""
  if not _log_reaches_terminal():
    logging.warning(message)
  print(f"warning | {message}", flush=True)
