"""Errors the framework reports as one line, each with its exit code."""


class ConfigError(ValueError):
  """A configuration problem; its message is one line naming the fix."""


class NonFiniteError(RuntimeError):
  """Training produced a non-finite loss or weights; nothing bad was saved.

  Attributes:
    step: The global step whose loss (or weights) was not finite.
  """

  def __init__(self, message: str, step: int):
    super().__init__(message)
    self.step = step


class Preempted(Exception):
  """Training stopped on SIGTERM/SIGINT after saving a checkpoint.

  Attributes:
    step: The step of the checkpoint saved on the way out.
    exit_code: What the process should exit with, telling a launcher to
      restart it (`trainer.preemption_exit_code`).
  """

  def __init__(self, step: int, exit_code: int):
    super().__init__(f"preempted at step {step}: checkpoint saved; run the "
                     f"same command again to resume (exit code {exit_code})")
    self.step = step
    self.exit_code = exit_code
