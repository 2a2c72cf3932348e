"""The tf.data service's stall watch: a run that waits for batches that do
not come says so, and ends the wait.

The service's client waits for batches as long as it takes, inside
TensorFlow, where neither the loop nor a signal handler gets control back
(measured); TensorFlow 2.20's `tf.data.experimental.service.distribute`
takes no read timeout, so a thread of ours watches the global step instead.
"""

import threading
import time
from typing import Callable, List, Optional

from trainer import console
from trainer.data import dispatcher
from trainer.data import service

# While a signal asks for a checkpoint, how long a loop may go without a
# new step before it is taken to wait for a batch; twice the slowest step
# the watch saw in this run where that is longer. A step through the
# service took ~25 ms in digits; the preemption grace period is 25 s.
SIGNAL_SECONDS = 2.0


class StallWatch:
  """Warns when training stops advancing while it reads from the service,
  and ends the wait after `runtime.data_service_timeout`, or at once on a
  signal.

  The service's client waits for batches as long as it takes: with no
  worker alive (none started yet, or all stopped) or the dispatcher down, a
  run would stay silent at its last line (measured), and the loop, blocked
  in `next` on the service's iterator, never comes back to save. This
  context runs a thread that prints one warning per stall, `seconds` inside
  training loops without a new step (twice as long before the first, which
  includes tracing; evaluations and saves between loops do not count), and
  calls `on_timeout` once a stall has lasted the timeout (doubled the same
  way). While `signalled_fn` says a signal asks for a checkpoint, a loop
  without a new step for `SIGNAL_SECONDS` (or twice its slowest step) waits
  for a batch: it calls `on_signal` instead of waiting for the loop (not
  before the first step, while the loop may still be tracing). It asks the
  dispatcher for its workers every `workers_seconds` while a loop runs, so
  that the end can name the ones it last saw.
  """

  def __init__(self, runtime, progress_fn: Callable[[], Optional[int]],
               on_timeout: Optional[Callable[[int, float, str], bool]] = None,
               seconds: float = 60.0, poll_seconds: float = 1.0,
               workers_seconds: float = 10.0,
               clock: Callable[[], float] = time.monotonic,
               workers_fn: Callable[[str], List[str]] = (
                   dispatcher.list_workers),
               signalled_fn: Callable[[], bool] = lambda: False,
               on_signal: Optional[Callable[[int, float, str], bool]] = None):
    """Creates the watch.

    Args:
      runtime: The `RuntimeConfig` naming the service and the timeout.
      progress_fn: Returns the step reached, read from the global step as
        it moves inside a loop, or None outside training loops.
      on_timeout: Called as `on_timeout(step, waited_seconds, why)` from
        the thread, `why` naming the dispatcher and its workers; it returns
        whether the run ends (False: training moved meanwhile). None: only
        warn.
      seconds: How long without a new step makes a stall.
      poll_seconds: How often the thread looks.
      workers_seconds: How often it asks the dispatcher for its workers.
      clock: Seconds, injectable for tests.
      workers_fn: Lists a dispatcher's workers (`list_workers`).
      signalled_fn: Returns whether a signal asks for a checkpoint.
      on_signal: Called as `on_timeout` is, when a signal asks for a
        checkpoint and the loop waits for a batch. None: the loop is waited
        for.
    """
    self._address = service.address(runtime)
    self._timeout = runtime.data_service_timeout if on_timeout else None
    self._on_timeout = on_timeout
    self._progress_fn = progress_fn
    self._seconds = seconds
    self._poll_seconds = poll_seconds
    self._workers_seconds = workers_seconds
    self._clock = clock
    self._workers_fn = workers_fn
    self._signalled_fn = signalled_fn
    self._on_signal = on_signal
    self._workers: Optional[List[str]] = None  # Last seen, and when.
    self._workers_at = self._asked_at = -float("inf")
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._watch, daemon=True,
                                    name="data_service_stall_watch")

  def __enter__(self) -> "StallWatch":
    self._thread.start()
    return self

  def __exit__(self, *unused_exc_info) -> None:
    self._stop.set()
    self._thread.join()

  def _watch(self) -> None:
    step, since, first, warned = self._progress_fn(), self._clock(), True, (
        False)
    slowest = 0.0  # The longest a trained step kept the step unchanged.
    while not self._stop.wait(self._poll_seconds):
      progress = self._progress_fn()
      if progress is None:  # Between loops: the input is not waited for.
        since = self._clock()
        continue
      self._ask_for_workers()
      if progress != step:
        if not first:
          slowest = max(slowest, self._clock() - since)
        # The first step seen starts the first loop: its patience stays
        # doubled until a step is trained.
        first = step is None
        step, since, warned = progress, self._clock(), False
        continue
      waited = self._clock() - since
      factor = 2 if first else 1
      if not warned and waited > factor * self._seconds:
        warned = True
        console.warning(
            f"training has not advanced from step {step} for {waited:.0f} "
            f"s; it reads its batches from the tf.data service at "
            f"{self._address}, which waits while the dispatcher is down or "
            "no worker is alive: start one with python "
            "scripts/data_service.py --port=PORT --dispatcher="
            f"{dispatcher.host_port(self._address)}")
      if (self._on_signal is not None and not first and
          waited > max(SIGNAL_SECONDS, 2 * slowest) and
          self._signalled_fn()):
        if self._on_signal(step, waited, self._why()):
          return
        since = self._clock()  # Its input came back meanwhile.
        continue
      if self._timeout is not None and waited > factor * self._timeout:
        if self._on_timeout(step, waited, self._why()):
          return
        since = self._clock()  # Its input came back meanwhile.

  def _ask_for_workers(self) -> None:
    """Asks the dispatcher for its workers, every `workers_seconds`."""
    if self._clock() - self._asked_at < self._workers_seconds:
      return
    self._asked_at = self._clock()
    try:
      workers = self._workers_fn(self._address)
    except dispatcher.NoDispatcher:
      return
    if workers:
      self._workers, self._workers_at = workers, self._clock()

  def _why(self) -> str:
    """Says what the dispatcher answers now, and the workers last seen."""
    try:
      workers = self._workers_fn(self._address)
    except dispatcher.NoDispatcher as e:
      return (f"the dispatcher at {self._address} does not answer "
              f"({e.reason}); {self._last_seen()}")
    if workers:
      return (f"the dispatcher at {self._address} has worker(s) "
              f"{', '.join(workers)}, which send none")
    return (f"the dispatcher at {self._address} has no worker; "
            f"{self._last_seen()}")

  def _last_seen(self) -> str:
    if not self._workers:
      return "no worker seen during this run"
    ago = self._clock() - self._workers_at
    return f"worker(s) last seen {ago:.0f} s ago: {', '.join(self._workers)}"


def timeout_line(runtime, step: int, waited: float, why: str,
                 saved: str) -> str:
  """The line a run ends with when no batch came in time."""
  return (f"no batch from the tf.data service for {waited:.0f} s at step "
          f"{step} (`runtime.data_service_timeout`): {why}; {saved}; start "
          "workers (python scripts/data_service.py --port=PORT --dispatcher="
          f"{dispatcher.host_port(service.address(runtime))}) and run the "
          "same command again")


def signal_reason(waited: float, why: str) -> str:
  """Why a signal's checkpoint was saved while the loop waits for a batch,
  for the preemption line."""
  return f"no batch from the tf.data service for {waited:.0f} s ({why})"
