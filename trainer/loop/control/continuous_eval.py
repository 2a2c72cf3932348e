"""Continuous evaluation that evaluates every checkpoint exactly once.

`tf.train.checkpoints_iterator` (what Orbit's `evaluate_continuously` uses)
yields only the newest checkpoint each time it looks, so an evaluator slower
than training skips checkpoints. Here the evaluator lists every checkpoint in
the state file, evaluates those it has not evaluated yet in step order, and
records each evaluated step in `model_dir/eval/evaluated.json`
(`trainer.storage.evaluated`), so a
restarted evaluator skips what it has done. A trainer with
`trainer.keep_until_evaluated` reads the same record and deletes no
checkpoint beyond `max_to_keep` before it has been evaluated
(`checkpoints.create_manager`); without it, a checkpoint deleted before its
turn is reported as missed. With named evaluation sets a step is recorded
once every set is evaluated: an evaluator stopped between two sets records
nothing, and the checkpoint stays until it is evaluated whole.
"""

import time
from typing import Any, Callable, Dict, Optional, Set, Tuple

import tensorflow as tf

from trainer import console
from trainer import errors
from trainer.storage import checkpoints
from trainer.storage import evaluated as evaluated_lib
from trainer.storage import files

# A checkpoint path -> (its step, the eval results).
EvaluateFn = Callable[[str], Tuple[int, Dict[str, Any]]]


def pending(model_dir: str, evaluated: Set[int]) -> list:
  """Returns `(step, prefix)` of unevaluated checkpoints, oldest first."""
  found = []
  for prefix in checkpoints.candidates(model_dir):
    step = checkpoints.number(prefix)
    if step >= 0 and step not in evaluated:
      found.append((step, prefix))
  return sorted(found)


def run(model_dir: str, evaluate_fn: EvaluateFn, train_steps: int,
        timeout: float, stop_fn: Optional[Callable[[], Optional[str]]] = None,
        max_to_keep: Optional[int] = None,
        poll_seconds: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep) -> Dict[str, Any]:
  """Evaluates each checkpoint of `model_dir` once, in step order.

  Args:
    model_dir: The training run's directory.
    evaluate_fn: Restores a checkpoint and evaluates it.
    train_steps: Stop once the checkpoint of this step is evaluated.
    timeout: Stop after this many seconds without a new checkpoint.
    stop_fn: Returns a reason to stop early (early stopping decided), or
      None.
    max_to_keep: With `trainer.keep_until_evaluated`, the trainer's
      `max_to_keep`: once the final step is evaluated, the evaluated
      checkpoints beyond it are deleted (the trainer, finished, cannot).
    poll_seconds: Wait between looks at the directory.
    clock: Seconds, for the timeout (injectable for tests).
    sleep: Waits, for the polling (injectable for tests).

  Returns:
    The results of the last evaluation, {} if none ran.

  Raises:
    errors.RunError: After `timeout` seconds without a new checkpoint
      before the one of `train_steps` is evaluated.
  """
  record = evaluated_lib.EvaluatedRecord(model_dir)
  if record.steps:
    console.info(f"continuous_eval | {len(record.steps)} checkpoint(s) "
                 f"already evaluated, up to step {max(record.steps)}")
  output = {}
  last_seen = clock()
  while True:
    for unused_step, prefix in pending(model_dir, record.steps):
      done = _evaluate(evaluate_fn, prefix)
      if done is None:
        continue
      step, output = done
      record.add(step, output)
      last_seen = clock()
      if step >= train_steps:
        if max_to_keep:
          checkpoints.trim(model_dir, max_to_keep, record.steps)
        return output
      reason = stop_fn() if stop_fn else None
      if reason:
        console.info(f"continuous_eval | stopping: {reason}")
        return output
    if record.steps and max(record.steps) >= train_steps:
      return output
    if clock() - last_seen > timeout:
      raise _no_new_checkpoint(model_dir, timeout, record.steps, train_steps)
    sleep(poll_seconds)


def _no_new_checkpoint(model_dir: str, timeout: float, evaluated: Set[int],
                       train_steps: int) -> errors.RunError:
  """The error of an evaluator that waited `timeout` seconds in vain."""
  last = max(evaluated) if evaluated else None
  return errors.RunError(
      f"continuous_eval: no new checkpoint in {model_dir} for "
      f"{timeout:g} s (`trainer.continuous_eval_timeout`); the last "
      f"evaluated step is {last}, not `trainer.train_steps` "
      f"({train_steps}): is the trainer running?")


def _evaluate(evaluate_fn: EvaluateFn, prefix: str):
  """Returns `evaluate_fn(prefix)`, or None for a checkpoint that cannot be
  restored or was deleted (said in one line)."""
  try:
    return evaluate_fn(prefix)
  # A checkpoint the trainer deletes while it is read: NotFoundError.
  except (errors.ConfigError, OSError, tf.errors.NotFoundError) as e:
    if files.exists(prefix + ".index"):
      console.log(f"cannot evaluate {prefix}: {e}")
      console.info(
          f"continuous_eval | skipped {prefix}: it cannot be restored")
    else:
      console.info(f"continuous_eval | missed {prefix}: deleted before it "
                   "was evaluated (set trainer.keep_until_evaluated=True "
                   "in the training run)")
    return None
