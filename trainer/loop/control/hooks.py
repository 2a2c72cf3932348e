"""`LoopHook`: what runs at a training loop's cadence, and what it is given.

The controller (`trainer.loop.control.controller.Controller`) runs training
as loops of `steps_per_loop` steps (one `tf.function` call each). Around
every loop it calls its hooks, in the order given:

    stop_reason()                     training stops before the loop if a
                                      hook gives a reason
    clip(step, num_steps)             each hook may shorten the loop (then
                                      the non-finite guard may, too)
    before_loop(step)
    ... the loop runs ...
    after_loop(step, result)          `step`: the step reached
      or after_rollback(step)         the loop hit a non-finite loss and
                                      was rolled back to `step`
    end(step)                         after the last loop of a `train`
                                      call (the final step, an early stop,
                                      or an evaluation in `train_and_evaluate`)

Where a change goes (docs/reference/development.md says the same):

- an Orbit action (`orbit.Action`, a callable in `train_actions` or
  `eval_actions`) reacts to a train or eval output: keeping the best
  checkpoint, recording an evaluation;
- a `LoopHook` runs at the loop's cadence: before and after each loop,
  cutting loops at a step, asking to stop (the progress line and train
  summaries, the profile window, early stopping);
- a context in `trainer.experiment` surrounds the whole run: the
  `model_dir` lease, the signal watch, the tf.data service's stall watch.

Early stopping is both: an eval action that records each evaluation, and a
hook whose `stop_reason` the loop asks.

Hooks observe the loop and may shorten or end it; they never change its
control flow otherwise. The two collaborators that do (the non-finite guard
rolls back, the preemption watcher saves and raises) stay explicit
arguments of the controller.

This module imports nothing of ours: any layer may implement a hook.
"""

import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional


@dataclasses.dataclass(frozen=True)
class LoopResult:
  """What a finished loop gives its hooks.

  Attributes:
    num_steps: The steps the loop ran.
    seconds: How long the loop took: the runner's `train` call, the read
      of its status, and the train actions and Orbit summaries after it.
    loss: The loop's mean loss; None where the runner reports none (a
      plain Orbit runner whose output has no `loss`).
    learning_rate: A scheduled learning rate after the loop, or None.
    output: The runner's output, as the train actions get it (with the
      loop's `loss` and scheduled `learning_rate` where the runner gives
      none).
    read_metrics: Returns the metrics accumulated since the last call and
      resets them; call it only when reporting them (it reads the device).
  """
  num_steps: int
  seconds: float
  loss: Optional[float]
  learning_rate: Optional[float]
  output: Mapping[str, Any]
  read_metrics: Callable[[], Dict[str, float]]


class LoopHook:
  """Runs at a training loop's cadence; every method does nothing by default.

  Subclass it and override what the hook needs: the controller calls a
  hook's `clip`, `before_loop`, `after_loop` and `stop_reason` only where
  its class overrides them, so a method left alone costs nothing per loop.
  All steps are global steps. Hooks run for every runner, a plain Orbit
  runner included (through `orbit_adapter`).
  """

  def clip(self, step: int, num_steps: int) -> int:
    """Returns the steps of the loop about to start at `step`: `num_steps`,
    or fewer to end it at a step of the hook's (a profile window's edge).
    """
    del step  # Unused by default.
    return num_steps

  def before_loop(self, step: int) -> None:
    """Called before the loop starting at `step`, its length settled."""

  def after_loop(self, step: int, result: LoopResult) -> None:
    """Called after a loop that reached `step`, before it is saved."""

  def after_rollback(self, step: int) -> None:
    """Called after a loop whose loss was not finite was rolled back to the
    checkpoint of `step`: the steps since are gone (and `after_loop` is not
    called for that loop)."""

  def stop_reason(self) -> Optional[str]:
    """Returns why training should stop before the next loop, or None to go
    on; asked before every loop. The controller then saves and says so."""
    return None

  def end(self, step: int) -> None:
    """Called after the last loop of a `train` call, at `step`: training
    reached its final step or stopped early, or `train_and_evaluate`
    evaluates next. Not called when training ends with an error."""
