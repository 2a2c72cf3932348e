"""The lines a process stopped by a signal exits with, where it cannot wait
for training to save: what was saved when, which steps were not, and how
to go on (`preemption.Receiver` picks the line)."""

import signal
from typing import Callable, Optional, Tuple, Union

from trainer import errors


REQUEUE_BEFORE_TRAINING = ("received SIGUSR1 before training: saving a "
                           "checkpoint and requeueing after the first loop")
REQUEUE_NOT_TRAINING = ("received SIGUSR1: this task does not train; the "
                        "chief's requeue stops it")


def signal_name(signum: int) -> str:
  """`SIGTERM` for `signal.SIGTERM`."""
  return signal.Signals(signum).name


def exit_line(error: errors.Preempted, requeue_fn: Callable[[bool], str]
              ) -> Union[str, Callable[[], str]]:
  """The line a process stopped by `error` exits with: a function where the
  stop asks for a requeue, which it makes (`requeue_fn(is_chief)`, see
  `preemption.RequeueFn`) when called."""
  if error.requeue:
    return lambda: error.line(requeue_fn(error.is_chief))
  return str(error)


def saving_after_loop(signum: int) -> str:
  """The warning for a signal that training saves for."""
  return f"received {signal_name(signum)}: saving a checkpoint after this loop"


def second_signal(signum: int) -> str:
  """Why a second signal ends training at once."""
  return f"a second signal ({signal_name(signum)}) ended it at once"


def grace_over(grace_seconds: float, first: int) -> str:
  """Why training is not waited for once the grace period is over."""
  return (f"training did not stop within {grace_seconds:g} s of "
          f"{signal_name(first)} (`trainer.preemption_grace_seconds`)")


def after_training(signum: int, step: int, exit_code: int,
                   requeued: Optional[str] = None) -> str:
  """A signal after training: the final checkpoint, of `step`, is saved;
  `requeued` says what became of the job where the signal asks for a
  requeue."""
  saved = (f"preempted by {signal_name(signum)} after training: the final "
           f"checkpoint (step {step}) is saved")
  if requeued is not None:
    return f"{saved}; {requeued}, to finish (exit code {exit_code})"
  return (f"{saved}; run the same command again to finish (exit code "
          f"{exit_code})")


def nothing_saved(signum: int, exit_code: int, training: bool) -> str:
  """A signal before training started (`training`: the mode trains), or in
  a mode that does not train."""
  name = signal_name(signum)
  if training:
    return (f"preempted by {name} before training started: nothing to "
            f"save; run the same command again (exit code {exit_code})")
  return (f"preempted by {name}: nothing to save; run the same command "
          f"again (exit code {exit_code})")


def forced(reason: str, exit_code: int,
           progress: Optional[Tuple[int, Optional[int]]], first: int,
           newest_at_signal: Optional[int]) -> str:
  """An exit during training, without waiting for it, for `reason`.

  Args:
    reason: Why the process does not wait.
    exit_code: The exit code the line names.
    progress: The step reached and the newest checkpoint's step (None:
      none yet), or None where unknown.
    first: The first signal received.
    newest_at_signal: The newest checkpoint's step when it came.
  """
  code = exit_code
  if progress is None:
    return (f"preempted: {reason}; run the same command again (exit code "
            f"{code})")
  step, newest = progress
  name = signal_name(first)
  if newest is None:
    saved = "no checkpoint is saved yet"
    if step:
      saved += f"; {_steps(1, step)} not saved"
    return (f"preempted at step {step}: {reason}; {saved}; run the same "
            f"command again to start over (exit code {code})")
  if newest == newest_at_signal:
    saved = f"the checkpoint of step {newest} was saved before {name}"
  else:
    saved = f"the checkpoint of step {newest} was saved for {name}"
  if step > newest:
    saved += f"; {_steps(newest + 1, step)} not saved"
  return (f"preempted at step {step}: {reason}; {saved}; run the same "
          f"command again to resume from step {newest} (exit code {code})")


def _steps(first: int, last: int) -> str:
  """`step 7 is` or `steps 501-507 are`."""
  if first == last:
    return f"step {first} is"
  return f"steps {first}-{last} are"
