"""Progress lines for the person running training, also kept in the log.

`train.py` tells what happens one line at a time on stdout
(`train | step ...`, `best | ...`, `warning | ...`), flushed so that a
launcher's log shows each line at once; absl's log gets the same text.
"""

from absl import logging


def info(message: str) -> None:
  """Prints `message` and logs it at INFO."""
  logging.info(message)
  print(message, flush=True)


def warning(message: str) -> None:
  """Prints `warning | message` and logs `message` at WARNING."""
  logging.warning(message)
  print(f"warning | {message}", flush=True)
