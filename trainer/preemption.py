"""Turning SIGTERM and SIGINT into a checkpoint and a "restart me" exit.

Schedulers stop a job with SIGTERM (then SIGKILL after a grace period). The
handler here only records the signal; the controller checks it after every
loop, saves a checkpoint at the step reached and stops with
`errors.Preempted`, which the command line turns into
`trainer.preemption_exit_code` (TensorFlow's own handler uses 42; 0 would
tell a scheduler the job finished). A second signal gets Python's default
behaviour, so a stuck run can still be stopped.

`tf.distribute.experimental.PreemptionCheckpointHandler` does the same but
numbers checkpoints by save count rather than step, and its constructor
queries the GCE metadata server (a 5 s timeout off GCE, measured); with
several workers the watcher here has them agree through one all-reduce.
"""

import signal
from typing import Optional

from absl import logging
import tensorflow as tf

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class PreemptionWatcher:
  """Records SIGTERM/SIGINT while installed; a context manager."""

  def __init__(self):
    self._received: Optional[int] = None
    self._previous = {}

  def __enter__(self) -> "PreemptionWatcher":
    for signum in SIGNALS:
      try:
        self._previous[signum] = signal.signal(signum, self._handle)
      except ValueError:  # Not the main thread: signals stay as they were.
        pass
    return self

  def __exit__(self, *unused_exc_info) -> None:
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)
    self._previous.clear()

  def _handle(self, signum, unused_frame) -> None:
    self._received = signum
    # The next one is handled as if no watcher were installed.
    signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))
    logging.warning("received %s: saving a checkpoint after this loop",
                    signal.Signals(signum).name)

  @property
  def received(self) -> bool:
    """Whether this process got a signal."""
    return self._received is not None

  def agreed(self, strategy: tf.distribute.Strategy,
             num_workers: int) -> bool:
    """Whether any worker got a signal; every worker must call it each loop.

    With several workers, one all-reduce makes them all stop after the same
    loop, so they save the same step together.
    """
    if num_workers == 1:
      return self.received
    flag = tf.constant(1.0 if self.received else 0.0)
    # ReduceOp has no MAX: a sum above zero means some worker got one.
    count = strategy.reduce(
        tf.distribute.ReduceOp.SUM,
        strategy.experimental_distribute_values_from_function(
            lambda unused_context: flag), axis=None)
    return bool(count.numpy() > 0)
