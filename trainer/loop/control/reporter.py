"""The progress line and the train summaries after each loop: a loop hook."""

import math
import time
from typing import Callable, Dict, Optional, Sequence, Tuple

import numpy as np

from trainer import console
from trainer.loop.control import hooks as loop_hooks
from trainer.report import summaries


def format_duration(seconds: float) -> str:
  """Formats seconds as `1h02m03s`, `2m03s` or `3s`."""
  seconds = int(round(seconds))
  hours, rest = divmod(seconds, 3600)
  minutes, seconds = divmod(rest, 60)
  if hours:
    return f"{hours}h{minutes:02d}m{seconds:02d}s"
  if minutes:
    return f"{minutes}m{seconds:02d}s"
  return f"{seconds}s"


def _eta_and_loss(eta_seconds: Optional[float],
                  loss: Optional[float]) -> Tuple[str, str]:
  """The ETA and the loss as the progress reports write them (`?` where
  unknown)."""
  eta = "?" if eta_seconds is None else format_duration(eta_seconds)
  if loss is None:
    return eta, "?"
  return eta, f"{loss:.4f}" if math.isfinite(loss) else str(loss)


def progress_line(step: int, train_steps: int, steps_per_second: float,
                  examples_per_second: float, loss: Optional[float],
                  eta_seconds: Optional[float]) -> str:
  """Returns the one-line training progress report (loss `?` where the
  runner reports none)."""
  eta, loss_text = _eta_and_loss(eta_seconds, loss)
  width = len(str(train_steps))
  return (f"train | step {step:{width}d}/{train_steps} | "
          f"{steps_per_second:7.1f} steps/s | "
          f"{examples_per_second:8.0f} examples/s | loss {loss_text} | "
          f"ETA {eta}")


# The bar's width in characters, at most and at least: within that, it
# takes what the terminal's width leaves to it.
BAR_WIDTH = (30, 10)


def progress_bar(step: int, train_steps: int, steps_per_second: float,
                 loss: Optional[float], eta_seconds: Optional[float],
                 columns: int = 80) -> str:
  """Returns the progress bar of an interactive terminal `columns` wide:
  `step 300/1000 [#########.....................]  30% | 412.3 steps/s |
  loss 0.1234 | ETA 2s`, the bar as wide as the line fits (see
  `BAR_WIDTH`)."""
  done = min(max(step / max(train_steps, 1), 0.0), 1.0)
  eta, loss_text = _eta_and_loss(eta_seconds, loss)
  width = len(str(train_steps))
  head = f"step {step:{width}d}/{train_steps} "
  tail = (f" {100 * done:3.0f}% | {steps_per_second:.1f} steps/s | "
          f"loss {loss_text} | ETA {eta}")
  # The cursor's column is left free: a full line would wrap.
  bar_width = min(max(columns - 1 - len(head) - len(tail) - 2, BAR_WIDTH[1]),
                  BAR_WIDTH[0])
  filled = int(done * bar_width)
  return f"{head}[{'#' * filled}{'.' * (bar_width - filled)}]{tail}"


# Training is reported as input-bound where the steps wait for the input
# pipeline more than this share of loop time AND longer than this per step.
# A share alone says nothing for small steps: taking a prefetched batch
# costs 0.1-0.2 ms a step on one device (measured on the digits task and the
# README's regression Task, 2 CPU cores) and about 1 ms on 2 replicas (a
# toy Task: "74% of the time (1.0 ms a step)"), so tiny models "wait" most
# of their time with nothing worth changing. Below 5 ms a step, waiting
# costs at most 5 s per 1,000 steps, less than finding a remedy does; a
# pipeline really behind its model waits tens of ms a step (64 ms a batch
# in test_controller's slow input).
INPUT_BOUND_FRACTION = 0.2
INPUT_BOUND_SECONDS_PER_STEP = 0.005


class TrainReporter(loop_hooks.LoopHook):
  """Loop hook: after each training loop, a progress line and train
  summaries.

  Train summaries (mean loss, every task metric, the gradient norm, the
  learning rate, steps/s, examples/s, the share of time spent waiting for
  input and what `scalars_fn` adds) are written every `summary_interval`
  steps and at the final step, `train_steps`; a scheduled learning rate also
  after every loop in between. Rates count time spent in training loops
  only, not in evaluations or checkpoint saves between them; the ETA uses
  the clock, which does.
  """

  def __init__(self, writer: Optional[summaries.Writer], *, train_steps: int,
               global_batch_size: int, summary_interval: int,
               scalars_fn: Optional[Callable[[], Dict[str, float]]] = None,
               summary_fns: Sequence[
                   Callable[[int, Dict[str, float]], None]] = (),
               bar: bool = False,
               clock: Callable[[], float] = time.perf_counter):
    """Creates the reporter.

    Args:
      writer: Where train summaries go; None for the progress line only.
      train_steps: The final step, for the ETA and the last summary.
      global_batch_size: Examples per step, for examples/s.
      summary_interval: Write summaries at multiples of this step.
      scalars_fn: Returns more train scalars (the loss scale, say).
      summary_fns: Each called with the step and the scalars of every
        train summary written (`metrics.csv`'s train rows, the Keras
        callbacks' logs).
      bar: Show progress as a bar redrawn in place (`progress_bar`), for
        an interactive terminal, in place of a `train |` line a loop.
      clock: Seconds, for the ETA; injectable for tests.
    """
    self._scalars = (None if writer is None else
                     summaries.ScalarWriter(writer))
    self._train_steps = train_steps
    self._global_batch_size = global_batch_size
    self._summary_interval = summary_interval
    self._scalars_fn = scalars_fn
    self._summary_fns = tuple(summary_fns)
    self._bar = bar
    self._clock = clock
    self._learning_rate = None  # The last one written.
    self._input_bound = False  # Whether training was found input-bound.
    self._run_start = None  # (step, time) after the first loop, for the ETA.
    self.reset_window()

  def reset_window(self) -> None:
    """Starts a new summary window."""
    self._window_steps = 0
    self._window_seconds = 0.0

  def after_rollback(self, step: int) -> None:
    """Drops the window: its steps are gone."""
    del step  # Unused.
    self.reset_window()

  def after_loop(self, step: int, result: loop_hooks.LoopResult) -> None:
    """Reports a loop that reached `step`: the progress line, and the
    summaries where due (the metrics are read, and reset, only then)."""
    steps_per_second = result.num_steps / max(result.seconds, 1e-9)
    self._window_steps += result.num_steps
    self._window_seconds += result.seconds
    eta = self._eta(step)
    line = progress_line(step, self._train_steps, steps_per_second,
                         steps_per_second * self._global_batch_size,
                         result.loss, eta)
    if self._bar:
      console.status(progress_bar(step, self._train_steps, steps_per_second,
                                  result.loss, eta, console.columns()),
                     log=line)
    else:
      console.info(line)
    if self._scalars is None:
      return
    if step % self._summary_interval == 0 or step >= self._train_steps:
      self._write_summaries(step, result.read_metrics())
    elif result.learning_rate is not None:  # A schedule's, between them.
      self._write_learning_rate(step, result.learning_rate)

  def end(self, step: int) -> None:
    """Keeps the bar's last state as a line of its own."""
    del step  # Unused.
    if self._bar:
      console.end_status()

  def _eta(self, step: int) -> Optional[float]:
    """Seconds to `train_steps` at the rate since the first loop (which
    includes tracing: None after it)."""
    now = self._clock()
    if self._run_start is None:
      self._run_start = (step, now)
      return None
    done = step - self._run_start[0]
    rate = done / max(now - self._run_start[1], 1e-9)
    return max(self._train_steps - step, 0) / max(rate, 1e-9)

  def _write_learning_rate(self, step: int, rate: float) -> None:
    """Writes a scheduled learning rate after a loop, if it changed.

    Between summaries only, and only when it changed: a write is a call of
    its own.
    """
    if rate == self._learning_rate:
      return
    # Not flushed: the writer flushes with the next full summary.
    self._scalars.write({"learning_rate": rate}, step, flush=False)
    self._learning_rate = rate

  def _write_summaries(self, step: int, metrics: Dict[str, float]) -> None:
    steps_per_second = self._window_steps / max(self._window_seconds, 1e-9)
    scalars: Dict[str, object] = dict(metrics)
    scalars["steps_per_second"] = steps_per_second
    scalars["examples_per_second"] = (steps_per_second *
                                      self._global_batch_size)
    if self._scalars_fn is not None:
      scalars.update(self._scalars_fn())
    if "learning_rate" in scalars:
      self._learning_rate = float(scalars["learning_rate"])
    waited = scalars.pop("input_wait_seconds", None)
    if waited is not None:
      scalars["input_wait_fraction"] = self._input_wait_fraction(step, waited)
    self._scalars.write(scalars, step)
    for summary_fn in self._summary_fns:
      summary_fn(step, scalars)
    if not np.isfinite(float(scalars["loss"])):
      console.log(f"training loss is {scalars['loss']} at step {step}")
    self.reset_window()

  def _input_wait_fraction(self, step: int, waited: float) -> float:
    """Returns the share of the window's loop time spent waiting for input;
    warns when it shows training is input-bound."""
    fraction = min(waited / max(self._window_seconds, 1e-9), 1.0)
    console.log(f"steps {step - self._window_steps} to {step} waited for "
                f"input {100 * fraction:.1f}% of the time")
    per_step = waited / max(self._window_steps, 1)
    if (fraction > INPUT_BOUND_FRACTION and
        per_step > INPUT_BOUND_SECONDS_PER_STEP and not self._input_bound):
      self._input_bound = True  # Once per run: the advice does not change.
      console.warning(
          f"input-bound: the steps to {step} waited for input "
          f"{100 * fraction:.0f}% of the time ({1000 * per_step:.1f} ms a "
          "step); scripts/benchmark_input.py times the pipeline alone, and "
          "the performance guide lists remedies.")
    return fraction
