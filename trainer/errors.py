"""Errors the framework reports as one line, each with its exit code."""

import contextlib
from typing import Optional


class ConfigError(ValueError):
  """A configuration problem; its message is one line naming the fix."""


class ConfigTypeError(ConfigError, TypeError):
  """A `ConfigError` about a value of the wrong type (what a Task's hook
  returns, say); still a `TypeError` to code that catches one."""


class CheckpointMismatch(ConfigError):
  """A checkpoint that does not fit what this run built (another model);
  a resume adds the settings that changed since it was saved.

  Attributes:
    names_way_out: Whether the message already says what to do instead
      (a model added since: which models to warm-start).
  """

  def __init__(self, message: str, names_way_out: bool = False):
    super().__init__(message)
    self.names_way_out = names_way_out


class InputMismatch(ConfigError):
  """A checkpoint whose saved input position another input pipeline cannot
  take (TensorFlow restores an iterator only into the pipeline it was saved
  from); not damage: every older checkpoint of the run holds the same.

  Attributes:
    cause: What does not fit, naming the checkpoint.
    way_out: How to resume anyway.
  """

  def __init__(self, cause: str, way_out: str):
    super().__init__(f"{cause}: {way_out}.")
    self.cause = cause
    self.way_out = way_out


class RunError(RuntimeError):
  """A run that cannot go on for a reason outside the configuration (a
  timeout, a directory gone); its message is one line, the exit code 1."""


class NonFiniteError(RuntimeError):
  """Training produced a non-finite loss or weights; nothing bad was saved.

  Attributes:
    step: The global step whose loss (or weights) was not finite.
  """

  def __init__(self, message: str, step: int):
    super().__init__(message)
    self.step = step


class Preempted(Exception):
  """Training stopped on a signal after saving a checkpoint.

  Attributes:
    step: The step of the checkpoint saved on the way out.
    exit_code: What the process should exit with, telling a launcher to
      restart it (`trainer.preemption_exit_code`).
    requeue: Whether the signal was SLURM's time-limit warning (SIGUSR1),
      after which the job is requeued.
    is_chief: Whether this process is the one that requeues.
    asked: Whether the user asked for the stop (Ctrl-C, SIGINT): its line
      is then not reported as an error.
    last: Whether `step` is the run's last: what a rerun has left to do is
      the final evaluation, not training.
  """

  def __init__(self, step: int, exit_code: int, requeue: bool = False,
               is_chief: bool = True, asked: bool = False,
               last: bool = False):
    self.step = step
    self.last = last
    self.exit_code = exit_code
    self.requeue = requeue
    self.is_chief = is_chief
    self.asked = asked
    super().__init__(self.line())

  def line(self, requeued: Optional[str] = None) -> str:
    """The exit line; `requeued` says what became of the SLURM job, where
    the stop asked for a requeue."""
    if requeued is None and self.last:
      return (f"preempted at step {self.step}, the last: checkpoint saved; "
              f"training is over, and only its final evaluation is left: run "
              f"the same command again to make it (exit code "
              f"{self.exit_code})")
    if requeued is None:
      return (f"preempted at step {self.step}: checkpoint saved; run the "
              f"same command again to resume (exit code {self.exit_code})")
    return (f"preempted at step {self.step} by SIGUSR1 (the time limit is "
            f"near): checkpoint saved; {requeued}, to resume from step "
            f"{self.step} (exit code {self.exit_code})")


@contextlib.contextmanager
def raised_as_is():
  """Re-raises the framework's own errors that reach it wrapped by AutoGraph.

  An error raised while a step is traced (a `ConfigError` naming a hook's
  mistake, say) comes out of `tf.function` as AutoGraph's `StagingError`,
  whose message starts with "in user code:" and its frames; the original
  is at the end of its `__context__` chain (one wrapper per nested
  function).
  """
  try:
    yield
  except Exception as e:  # pylint: disable=broad-except
    inner = e
    while (getattr(inner, "ag_error_metadata", None) is not None and
           type(inner).__name__ == "StagingError" and inner.__context__):
      inner = inner.__context__
    if inner is not e and isinstance(
        inner, (ConfigError, NonFiniteError, Preempted)):
      raise inner from None
    raise
