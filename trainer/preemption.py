"""Turning SIGTERM and SIGINT into a checkpoint and a "restart me" exit.

Schedulers stop a job with SIGTERM, then SIGKILL after a grace period
(Kubernetes: 30 s by default; Slurm: `KillWait`, 30 s by default). The first
signal during training asks for a checkpoint: the controller checks after
every loop (and every evaluation between loops), saves at the step reached
and stops with `errors.Preempted`, which the command line turns into
`trainer.preemption_exit_code` (TensorFlow's own handler uses 42; 0 would
tell a scheduler the job finished). If training has not stopped
`trainer.preemption_grace_seconds` after the signal (a loop stuck on its
input, say), or on a second signal (the same signal again within
`DUPLICATE_SECONDS` is the same delivery), the process exits at once with
the same code, saying which step it reached and which checkpoint was saved
when, keeping the checkpoints already saved (a save is written to
`ckpt-N_temp` and renamed, and the state file is updated last, so an
interrupted save is never restored). A loop known to wait for input that
does not come (the tf.data service's stall watch, `trainer.data.service`)
is not waited for: the step it reached is saved while it waits, and the
process exits with the same code (`PreemptionWatcher.end_waiting`). Outside
training (start-up, the final evaluation and export, the eval modes)
nothing waits: the process exits at once. The lines it exits with, where
it cannot wait for training to save (what was saved when, which steps were
not, and how to go on), are at the end of this module.

Python runs a signal handler only when the main thread returns to bytecode,
never while it waits inside TensorFlow (a step, an input blocked in a
`tf.py_function`). So `train.py` blocks both signals before TensorFlow starts
its threads (they inherit the mask) and a `Receiver` takes them on a thread
of its own with `signal.sigwait`. Without a receiver (the library called
in-process), `PreemptionWatcher` installs Python handlers instead: it works
between TensorFlow calls only, and a second signal gets Python's default.

`tf.distribute.experimental.PreemptionCheckpointHandler` does the same but
numbers checkpoints by save count rather than step, and its constructor
queries the GCE metadata server (a 5 s timeout off GCE, measured); with
several workers the watcher here has them agree through one all-reduce.

SIGUSR1 is SLURM's warning before a job's time limit (`#SBATCH
--signal=USR1@90`): it saves like SIGTERM, and then the chief requeues the
job so that it resumes when SLURM starts it again. Before training it waits
for the first loop (a job always gets somewhere); in a task that does not
train (a parameter server, an evaluator) it changes nothing: the chief's
requeue stops every task. This module knows no scheduler: the requeue is a
`RequeueFn` its caller passes in (the command line passes SLURM's,
`trainer.distribute.slurm.requeue_outcome`).
"""

import contextlib
import signal
import threading
import time
from typing import Callable, Iterator, Optional, Union

import tensorflow as tf

from trainer import console
from trainer import errors
from trainer.loop.control import watcher as watcher_lib

REQUEUE_SIGNAL = signal.SIGUSR1
SIGNALS = (signal.SIGTERM, signal.SIGINT, REQUEUE_SIGNAL)
DEFAULT_EXIT_CODE = 42
DEFAULT_GRACE_SECONDS = 25.0
# The same signal again this soon is the same delivery: `timeout` (and `kill
# 0`) signals the process and then its group, so it gets two SIGTERMs.
DUPLICATE_SECONDS = 1.0
REQUEUE_BEFORE_TRAINING = ("received SIGUSR1 before training: saving a "
                           "checkpoint and requeueing after the first loop")
REQUEUE_NOT_TRAINING = ("received SIGUSR1: this task does not train; the "
                        "chief's requeue stops it")

# The step reached and the newest checkpoint's step (None: none yet), as
# the controller's `progress` gives them.
Progress = watcher_lib.Progress
# Requeues the job after a stop for SIGUSR1 where the process is the chief
# (its argument) and returns what became of the job, for the exit line.
RequeueFn = Callable[[bool], str]


def block_signals() -> None:
  """Blocks SIGTERM, SIGINT and SIGUSR1 in this thread and the threads it
  starts.

  Call it before TensorFlow is imported: threads started earlier keep the
  signals unblocked and may take one with its default action.
  """
  signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)


def start_receiver(exit_fn: Callable[..., None],
                   requeue_fn: RequeueFn) -> "Receiver":
  """Blocks SIGTERM, SIGINT and SIGUSR1 and receives them on a daemon thread.

  Call it once per process, and give the receiver to the watcher of each
  run (`PreemptionWatcher(receiver=...)`).

  Args:
    exit_fn: Called as `exit_fn(line, exit_code, asked=False)` to end the
      process at once (`asked`: the user asked for the stop, with SIGINT);
      it must not return.
    requeue_fn: Requeues the job after a stop for SIGUSR1.

  Returns:
    The receiver, serving.
  """
  block_signals()
  receiver = Receiver(exit_fn, requeue_fn)
  threading.Thread(target=receiver.serve, name="signal-receiver",
                   daemon=True).start()
  return receiver


class PreemptionWatcher:
  """Records SIGTERM/SIGINT for the controller; a context manager.

  Entered, it attaches to the process's `Receiver` where it is given one,
  or else installs Python handlers. The controller opens `armed()` windows
  where a signal asks for a checkpoint; `progress_fn` gives the step
  reached for the line printed if the process must exit without one.
  """

  def __init__(self, exit_code: int = DEFAULT_EXIT_CODE,
               num_workers: int = 1, is_chief: bool = True,
               progress_fn: Optional[Callable[[], Optional[Progress]]] = None,
               receiver: Optional["Receiver"] = None):
    """Creates a watcher.

    Args:
      exit_code: What `errors.Preempted` carries after the save.
      num_workers: Workers that must agree on stopping (`agreed`).
      is_chief: Whether this process requeues a SLURM job on SIGUSR1.
      progress_fn: Returns the step reached and the newest checkpoint's step
        (None: none), or None before training has a step (the controller's
        `progress`); called from the signal thread.
      receiver: The process's receiver (`start_receiver`); None where the
        library runs in-process.
    """
    self.exit_code = exit_code
    self.num_workers = num_workers
    self.is_chief = is_chief
    self._received: Optional[int] = None
    self._first_received: Optional[int] = None
    self._requeue = False  # This process got SIGUSR1.
    self._requeue_agreed = False  # Some worker got SIGUSR1.
    self._previous = {}
    self._armed = 0
    self._trained = False
    self._progress_fn = progress_fn
    self._receiver = receiver
    # Set once a checkpoint is saved for a signal: the process is on its way
    # out with this error's line.
    self.stopping: Optional[errors.Preempted] = None

  def __enter__(self) -> "PreemptionWatcher":
    if self._receiver is not None:
      self._receiver.attach(self)
      return self
    for signum in SIGNALS:
      try:
        self._previous[signum] = signal.signal(signum, self._handle)
      except ValueError:  # Not the main thread: signals stay as they were.
        pass
    return self

  def __exit__(self, *unused_exc_info) -> None:
    # A receiver keeps the watcher: a signal after training says so.
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)
    self._previous.clear()

  def _handle(self, signum, unused_frame) -> None:
    self.defer(signum)
    # The next one is handled as if no watcher were installed.
    signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))
    console.warning(saving_after_loop(signum))

  @contextlib.contextmanager
  def armed(self) -> Iterator[None]:
    """A window (nestable) in which a signal asks for a checkpoint.

    Leaving the outermost window without an error marks training as done.
    """
    self._armed += 1
    try:
      yield
    finally:
      self._armed -= 1
    if not self._armed:
      self._trained = True

  @property
  def is_armed(self) -> bool:
    """Whether a signal now asks for a checkpoint."""
    return self._armed > 0

  @property
  def trained(self) -> bool:
    """Whether an armed window ended without an error: training is done."""
    return self._trained

  def defer(self, signum: int) -> bool:
    """Records `signum`; returns whether training will save for it.

    The signal is recorded before the window is read: a window closing at
    the same time either sees it (and stops) or is seen closed.
    """
    self._requeue = self._requeue or signum == REQUEUE_SIGNAL
    self._received = signum
    if self._first_received is None:
      self._first_received = signum
    return self.is_armed

  def end_process(self, line: str, exit_code: int = 1) -> bool:
    """Ends the process with `line`, as a signal outside training does, from
    any thread (a loop blocked inside TensorFlow cannot be stopped
    otherwise).

    Returns:
      False without a receiver (the library run in-process): then `line` is
      only warned about.
    """
    if self._receiver is None:
      console.warning(line)
      return False
    self._receiver.exit(line, exit_code)
    return True

  def end_waiting(self, reason: str) -> bool:
    """Ends the process for the signal that asked for a checkpoint, without
    waiting for a loop that waits for input which does not come (the
    tf.data service with no worker): call it once the step reached is saved
    while the loop waits. The line says the step reached, `reason`, and
    which checkpoint was saved when, as the grace period's end does.

    Returns:
      False without a receiver (the library run in-process, where a signal
      is not seen while the loop waits inside TensorFlow).
    """
    if self._receiver is None:
      return False
    self._receiver.end_waiting(reason)
    return True

  def progress(self) -> Optional[Progress]:
    """The step reached and the newest checkpoint's step, or None where
    unknown."""
    return None if self._progress_fn is None else self._progress_fn()

  @property
  def received(self) -> bool:
    """Whether this process got a signal."""
    return self._received is not None

  def stopped(self, step: int, agreed: bool = False,
              last: bool = False) -> errors.Preempted:
    """The error to stop with after saving `step` (`last`: the run's last
    step): it asks for a requeue where this process (or, `agreed`, any
    worker) got SIGUSR1."""
    requeue = self._requeue_agreed if agreed else self._requeue
    self.stopping = errors.Preempted(
        step, self.exit_code, requeue=requeue, is_chief=self.is_chief,
        asked=self._first_received == signal.SIGINT, last=last)
    return self.stopping

  def agreed(self, strategy: tf.distribute.Strategy) -> bool:
    """Whether any worker got a signal; every worker must call it each loop.

    With several workers, one all-reduce makes them all stop after the same
    loop, so they save the same step together.
    """
    if self.num_workers == 1:
      self._requeue_agreed = self._requeue
      return self.received
    flags = tf.constant([float(self.received), float(self._requeue)])
    # ReduceOp has no MAX: a sum above zero means some worker got one.
    counts = strategy.reduce(
        tf.distribute.ReduceOp.SUM,
        strategy.experimental_distribute_values_from_function(
            lambda unused_context: flags), axis=None).numpy()
    self._requeue_agreed = bool(counts[1] > 0)
    return bool(counts[0] > 0)


class Receiver:
  """Takes SIGTERM and SIGINT on its own thread, whatever the main thread
  is doing, and decides between a checkpoint and an exit at once.

  Until `configure` is called, a signal waits for it (the exit code is part
  of the configuration).
  """

  def __init__(self, exit_fn: Callable[..., None], requeue_fn: RequeueFn,
               clock: Callable[[], float] = time.monotonic):
    """Creates a receiver; `serve` runs it.

    Args:
      exit_fn: Ends the process: `exit_fn(line, exit_code, asked=False)`;
        `line` may be a function returning it, called once the process is
        sure to exit; `asked` says the user asked for the stop (SIGINT).
      requeue_fn: Requeues the job after a stop for SIGUSR1.
      clock: Seconds, for the grace period.
    """
    self._exit_fn = exit_fn
    self._requeue_fn = requeue_fn
    self._clock = clock
    self._exit_code = DEFAULT_EXIT_CODE
    self._grace_seconds = DEFAULT_GRACE_SECONDS
    self._training = True
    self._configured = False
    self._first: Optional[int] = None
    self._first_at = 0.0
    # The newest checkpoint's step when the first signal came.
    self._newest_at_signal: Optional[int] = None
    self._deadline: Optional[float] = None
    self._pending_requeue = False  # SIGUSR1 before the watcher came.
    self.watcher: Optional[PreemptionWatcher] = None

  def exit(self, line: str, exit_code: int) -> None:
    """Ends the process with `line` and `exit_code`."""
    self._exit_fn(line, exit_code)

  @property
  def _asked(self) -> bool:
    """Whether the user asked for the stop: the first signal was SIGINT."""
    return self._first == signal.SIGINT

  def attach(self, watcher: PreemptionWatcher) -> None:
    """Makes `watcher` the one signals are recorded in, passing on a
    SIGUSR1 that came before it."""
    self.watcher = watcher
    if self._pending_requeue:
      self._pending_requeue = False
      watcher.defer(REQUEUE_SIGNAL)

  def configure(self, exit_code: int, grace_seconds: float,
                training: bool) -> None:
    """Sets the exit code and grace period; exits now if a signal came.

    Args:
      exit_code: `trainer.preemption_exit_code`.
      grace_seconds: `trainer.preemption_grace_seconds`.
      training: Whether the mode trains (for the exit line).
    """
    self._exit_code = exit_code
    self._grace_seconds = grace_seconds
    self._training = training
    self._configured = True
    if self._first is not None:
      self._exit_now(self._first)
    if self._pending_requeue and not training:
      self._pending_requeue = False
      console.warning(REQUEUE_NOT_TRAINING)

  def serve(self) -> None:
    """Receives signals until the process ends."""
    while True:
      if self._deadline is None:
        self.handle(signal.sigwait(SIGNALS))
        continue
      info = signal.sigtimedwait(
          SIGNALS, max(self._deadline - self._clock(), 0.0))
      if info is None:
        self.expire()
      else:
        self.handle(info.si_signo)

  def handle(self, signum: int) -> None:
    """Acts on one signal."""
    if (self._first is not None and signum == self._first and
        self._clock() - self._first_at < DUPLICATE_SECONDS):
      return
    stopping = self.watcher.stopping if self.watcher else None
    if stopping is not None:
      # Saved already, for this process's signal or another worker's: the
      # SIGTERM a chief's requeue sends every task (or an impatient second
      # Ctrl-C) ends the process with the line of that save.
      self._exit_fn(exit_line(stopping, self._requeue_fn),
                    stopping.exit_code, asked=stopping.asked)
      return
    if (signum == REQUEUE_SIGNAL and self._first is None and
        self._wait_to_requeue()):
      return
    if self._first is not None:
      if not self._configured:
        self._exit_now(self._first)
      else:
        self._exit_forced(second_signal(signum))
      return
    self._first, self._first_at = signum, self._clock()
    progress = self._progress()
    self._newest_at_signal = progress[1] if progress else None
    if not self._configured:
      # Waits for the configured exit code, at most the default grace.
      self._deadline = self._clock() + self._grace_seconds
    elif self.watcher is None or not self.watcher.defer(signum):
      self._exit_now(signum)
    else:
      console.warning(saving_after_loop(signum))
      self._deadline = self._clock() + self._grace_seconds

  def _wait_to_requeue(self) -> bool:
    """Takes a first SIGUSR1 where it does not stop the process now: before
    training (the first loop saves), or in a task that does not train.
    Returns whether it did."""
    watcher = self.watcher
    if self._configured and not self._training:
      console.warning(REQUEUE_NOT_TRAINING)
      return True
    if watcher is not None and (watcher.is_armed or watcher.trained):
      return False  # Saved after this loop, or exits now: like SIGTERM.
    if watcher is not None:
      watcher.defer(REQUEUE_SIGNAL)
    else:
      self._pending_requeue = True
    console.warning(REQUEUE_BEFORE_TRAINING)
    return True

  def expire(self) -> None:
    """Ends the process: the grace period after the first signal is over."""
    if not self._configured:
      self._exit_now(self._first)
    else:
      self._exit_forced(grace_over(self._grace_seconds, self._first))

  def end_waiting(self, reason: str) -> None:
    """Ends the process during training before the loop comes back, for
    `reason` (see `PreemptionWatcher.end_waiting`)."""
    self._exit_forced(reason)

  def _progress(self) -> Optional[Progress]:
    watcher = self.watcher
    return None if watcher is None else watcher.progress()

  def _exit_now(self, signum: int) -> None:
    """Exits at once for a signal outside training."""
    code = self._exit_code
    watcher, progress = self.watcher, self._progress()
    if watcher is not None and watcher.trained and progress:
      if signum == REQUEUE_SIGNAL:
        # Requeued from the exit function, under its lock: the SIGTERM the
        # requeue sends this task cannot print a second line.
        line = lambda: after_training(
            signum, progress[0], code, self._requeue_fn(watcher.is_chief))
      else:
        line = after_training(signum, progress[0], code)
    else:
      line = nothing_saved(signum, code, self._training)
    self._exit_fn(line, code, asked=self._asked)

  def _exit_forced(self, reason: str) -> None:
    """Exits during training, without waiting for it, saying the step
    reached, and which checkpoint was saved when."""
    self._exit_fn(forced(reason, self._exit_code, self._progress(),
                         self._first, self._newest_at_signal),
                  self._exit_code, asked=self._asked)


# The lines a process stopped by a signal exits with, where it cannot wait
# for training to save; `Receiver` picks the line.


def signal_name(signum: int) -> str:
  """`SIGTERM` for `signal.SIGTERM`."""
  return signal.Signals(signum).name


def exit_line(error: errors.Preempted, requeue_fn: RequeueFn
              ) -> Union[str, Callable[[], str]]:
  """The line a process stopped by `error` exits with: a function where the
  stop asks for a requeue, which it makes (`requeue_fn(is_chief)`) when
  called."""
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
           progress: Optional[Progress], first: int,
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
