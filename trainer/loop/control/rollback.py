"""What a non-finite training loss does: stop, or roll back and skip.

`NonFiniteGuard` holds the policy (`trainer.on_nonfinite`), counts the
rollbacks, refuses to save non-finite variables, and skips the batch of the
step that went wrong once training is back before it. The controller decides
when each is asked.
"""

from typing import Callable, Optional

from trainer import console
from trainer import errors

POLICIES = ("stop", "rollback")


class NonFiniteGuard:
  """The non-finite loss policy and the state of its rollbacks."""

  def __init__(self, policy: str = "stop", max_rollbacks: int = 0,
               finite_fn: Optional[Callable[[], bool]] = None,
               resume_input_fn: Optional[Callable[[int], object]] = None):
    """Creates the guard.

    Args:
      policy: One of `POLICIES`. "stop" raises `errors.NonFiniteError` naming
        the step; "rollback" restores the newest checkpoint and skips the
        offending batch.
      max_rollbacks: Rollbacks allowed before stopping anyway.
      finite_fn: Returns whether every checkpointed variable is finite;
        asked before each save, so no checkpoint holds NaN or Inf.
      resume_input_fn: Called with the restored step after a rollback when
        the input position is not part of the checkpoint.
    """
    self._policy = policy
    self._max_rollbacks = max_rollbacks
    self._finite_fn = finite_fn
    self._resume_input_fn = resume_input_fn
    self.rollbacks = 0
    self._discard_at: Optional[int] = None  # The step whose batch to skip.

  @property
  def rolls_back(self) -> bool:
    """Whether a non-finite loss rolls back (it needs a checkpoint)."""
    return self._policy == "rollback"

  def check_saveable(self, step: int, last_saved_step: int) -> None:
    """Raises instead of letting non-finite variables be saved.

    Raises:
      errors.NonFiniteError: If `finite_fn` says a variable is not finite.
    """
    if self._finite_fn is not None and not self._finite_fn():
      raise errors.NonFiniteError(
          f"variables are not finite at step {step}; not saved (the newest "
          f"checkpoint is step {last_saved_step}).", step)

  def clip(self, step: int, num_steps: int,
           discard_fn: Callable[[], None]) -> int:
    """Returns the steps of a loop from `step`, ending before the batch to
    skip; skips it (`discard_fn`) when the loop starts right before it."""
    if self._discard_at is None:
      return num_steps
    if step == self._discard_at - 1:
      discard_fn()
      console.info(f"train | skipped the batch of step {self._discard_at}")
      self._discard_at = None
      return num_steps
    return min(num_steps, self._discard_at - 1 - step)

  def start_rollback(self, step: int, last_saved_step: int,
                     has_checkpoint: bool) -> None:
    """Records a rollback for the non-finite loss at `step`, or stops.

    Raises:
      errors.NonFiniteError: Under "stop", or when rollbacks are used up.
    """
    if not self.rolls_back or self.rollbacks >= self._max_rollbacks:
      reason = (f" after {self.rollbacks} rollback(s)" if self.rolls_back
                else "")
      saved = (f"the newest checkpoint (step {last_saved_step}) was saved "
               "before it and holds finite values" if has_checkpoint
               else "no checkpoint was saved before it")
      raise errors.NonFiniteError(
          f"the training loss is not finite at step {step}{reason}; "
          f"{saved}.", step)
    self.rollbacks += 1
    self._discard_at = step

  def finish_rollback(self, restored_step: int) -> None:
    """Puts the input back at `restored_step` and says what happened."""
    if self._resume_input_fn is not None:
      self._resume_input_fn(restored_step)
    console.info(f"train | non-finite loss at step {self._discard_at}: rolled "
                 f"back to step {restored_step}, skipping that step's batch "
                 f"(rollback {self.rollbacks} of {self._max_rollbacks})")
