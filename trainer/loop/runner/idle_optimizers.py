"""The check that a Task with several models stepped every optimizer.

A `train_step` that forgets one of its optimizers trains a model that never
changes, and nothing fails: after the first loop, each optimizer must have
applied gradients.
"""

from trainer import errors
from trainer.model import named
from trainer.model import optimization


def check(task_name: str, optimizer) -> None:
  """Checks that each of several optimizers (`trainer.model.named`) has applied
  gradients; one optimizer is not checked.

  Args:
    task_name: The Task's class name, for the message.
    optimizer: The Task's optimizer, or its optimizers by model name.

  Raises:
    errors.ConfigError: Naming the optimizers that took no step.
  """
  if not named.several(optimizer):
    return
  idle = [name for name, each in sorted(named.named(optimizer).items())
          if int(optimization.unwrap(each).iterations.numpy()) == 0]
  if idle:
    raise errors.ConfigError(
        f"{task_name}.train_step applied no gradients with "
        f"the optimizer of {', '.join(repr(n) for n in idle)}: call "
        "`trainer.minimize(tape, loss, model.trainable_variables, "
        "optimizer[name])` for each trained model, or freeze the model "
        "(`model.trainable = False`), which then gets no optimizer.")
