"""One trial: a `train.py` process in its model_dir, watched until it ends.

The sweep reads each evaluation back from the run's own record
(`trainer.storage.evaluated`, which `trainer.actions.EvaluatedStepRecorder`
writes after every evaluation) to feed Optuna's pruner, and stops a pruned
run with SIGTERM, on which `train.py` saves a checkpoint and exits with its
preemption code. A killed run's step and metric come from its records too
(its last evaluation; how far it got by its `metrics.csv`), never from its
log lines, which a kill may leave ahead of both.

A process writes its output to a local file: a URL model_dir's log is kept
on this machine while the trial runs, and copied to `model_dir/sweep.log`
every `LOG_COPY_SECONDS` and when it ends (a sweep killed with its machine
loses at most that much of it).
"""

import dataclasses
import errno
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Set

from trainer import console
from trainer.actions import metrics_csv
from trainer.storage import evaluated
from trainer.storage import files
from trainer.sweeps import warm

# How often a URL model_dir's log is copied there while its trial runs: a
# whole object each time (an object store cannot append).
LOG_COPY_SECONDS = 30.0

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))  # local-path: the repository's own file
TRAIN_PY = os.path.join(REPO_ROOT, "train.py")
LOG = "sweep.log"

COMPLETE, FAIL, PRUNED, STOPPED = "COMPLETE", "FAIL", "PRUNED", "STOPPED"
KILLED = "KILLED"
# What a failed run says when its disk is full (train.py's error line
# carries the OS's text).
NO_SPACE = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT))
# Hints on the signals that end a process without its say.
_HINTS = {signal.SIGKILL: ": out of memory?"}

# A trial under a launcher (`srun`): the launcher, which passes SIGTERM on
# to its tasks, gets SIGTERM when the sweep thread that started it dies,
# even by SIGKILL, as a trial's own process does (`trainer.sweeps.warm`): so the
# trial checkpoints and exits instead of training on unwatched and holding
# its model_dir's lease against the rerun that resumes it.
_LAUNCHER_PRELUDE = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG\n"
    "if os.getppid() != int(sys.argv[1]): os._exit(143)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n")


@dataclasses.dataclass
class Outcome:
  """How a trial's process ended.

  Attributes:
    state: COMPLETE, FAIL, PRUNED, STOPPED (the sweep was stopped; the
      trial stays RUNNING, to be resumed) or KILLED (by a signal it could
      not handle, SIGKILL from the OOM killer most often).
    value: The metric at the last evaluation, or None.
    step: The last step the process reported; a KILLED run's last
      evaluated step (that of `value`), from its record.
    seconds: The process's wall time.
    cause: A failure's one line (train.py's error line).
  """
  state: str
  value: Optional[float]
  step: int
  seconds: float
  cause: str = ""


def command(gin_files: Sequence[str], gin_params: Sequence[str], mode: str,
            model_dir: str, python: str = "python") -> List[str]:
  """The `train.py` command of a trial."""
  return ([python, os.path.relpath(TRAIN_PY)] +  # local-path: our train.py
          [f"--gin_file={path}" for path in gin_files] +
          [f"--gin_param={param}" for param in gin_params] +
          [f"--mode={mode}", f"--model_dir={model_dir}"])


def evaluations(model_dir: str, metric: str) -> Dict[int, float]:
  """`{step: metric}` of every evaluation the run recorded so far."""
  return evaluated.metric_by_step(model_dir, metric)


_STEP = re.compile(r"\bstep (\d+)")
# train.py's progress line, `train | step  150/200 | ...`: the run's total.
_TOTAL = re.compile(r"^train \| step +\d+/(\d+) \|")


def _tail(log_path: str, offset: int) -> List[str]:
  # The log a process writes is local (`TrialProcess`).
  with open(log_path, errors="replace") as f:  # local-path: see above
    f.seek(offset)
    return [line.rstrip("\n") for line in f if line.strip()]


def cause(lines: Sequence[str], returncode: int) -> str:
  """train.py's error line (its last), else the last line and the code."""
  for line in reversed(lines):
    if line.startswith("train.py: "):
      return line[len("train.py: "):]
  last = lines[-1] if lines else "no output"
  return f"exit code {returncode}: {last}"


def killed_cause(signum: int, step: int) -> str:
  """`killed by SIGKILL at step 200: out of memory?`."""
  try:
    name = signal.Signals(signum).name
  except ValueError:
    name = f"signal {signum}"
  return f"killed by {name} at step {step}{_HINTS.get(signum, '')}"


def no_space(cause_line: str) -> bool:
  """Whether a failed run's line says its disk is full."""
  return any(text in cause_line for text in NO_SPACE)


def _last_step(lines: Sequence[str]) -> int:
  for line in reversed(lines):
    found = _STEP.search(line)
    if found:
      return int(found.group(1))
  return 0


def _total_steps(log_path: str, offset: int) -> Optional[int]:
  """The run's `train_steps`, from its progress lines; None before one."""
  for line in reversed(_tail(log_path, offset)):
    found = _TOTAL.match(line)
    if found:
      return int(found.group(1))
  return None


def _reached_step(model_dir: str, found: Dict[int, float]) -> int:
  """How far a run got by its records: its last row in `metrics.csv` or
  its last evaluation (`found`), whichever is later; 0 before either."""
  return max([metrics_csv.last_step(model_dir) or 0, *found])


def _evaluated_last_step(model_dir: str, metric: str,
                         total: Optional[int]) -> bool:
  """Whether the run has evaluated its last step (`total`)."""
  found = evaluations(model_dir, metric)
  return total is not None and bool(found) and max(found) >= total


def _exited(process: subprocess.Popen, seconds: float) -> bool:
  """Waits up to `seconds` for `process` to exit; returns whether it did
  (at once when it does, so the next trial starts without a wait)."""
  try:
    process.wait(timeout=seconds)
  except subprocess.TimeoutExpired:
    return False
  return True


class TrialProcess:
  """A trial's `train.py` process, output appended to `model_dir/sweep.log`
  (or to `log_path`, copied there when it ends).

  Args:
    argv: The trial's `train.py` command (`command()`).
    model_dir: The trial's model_dir.
    metric: The evaluation result optimised.
    preemption_exit_code: train.py's exit code after a SIGTERM.
    launcher: A command to run train.py under (`launch`); empty: none.
    python: A process started ahead (`trainer.sweeps.warm`) to run train.py in;
      None or a dead one: a new one. Unused under a launcher.
    log_path: Where the output goes while the process runs, a local file:
      for a URL `model_dir`, which a process cannot append to. Default:
      `model_dir/sweep.log`.
  """

  def __init__(self, argv: Sequence[str], model_dir: str, metric: str,
               preemption_exit_code: int = 42, launcher: Sequence[str] = (),
               python: Optional[warm.WarmPython] = None,
               log_path: Optional[str] = None):
    self._log = os.path.join(model_dir, LOG)
    self._log_path = log_path or self._log
    if files.is_url(self._log_path):
      raise ValueError(f"{self._log_path} is a URL: a process writes its "
                       "output to a local file, give one as `log_path`.")
    self._launcher = list(launcher)
    self._python = python
    self._argv = list(argv)
    self._model_dir = model_dir
    self._metric = metric
    self._preemption_exit_code = preemption_exit_code
    self._process: Optional[subprocess.Popen] = None
    self._signalled = False

  def signal(self, signum: int) -> None:
    """Sends `signum` to the process if it runs (the sweep passes on its
    own SIGTERM, SIGINT or SIGUSR1 at once: train.py takes the same signal
    twice within a second as one)."""
    self._signalled = True
    if self._process is not None and self._process.poll() is None:
      self._process.send_signal(signum)

  def run(self, report: Callable[[int, float], bool],
          stop: threading.Event, poll_seconds: float = 1.0) -> Outcome:
    """Runs the process to its end.

    Args:
      report: Called with each new evaluation's step and metric; returns
        True when the trial should be pruned. Called too, once the process
        has ended, for the evaluations it recorded after the last poll
        (the verdict then ignored).
      stop: Set when the sweep stops: the process, unless `signal` passed it
        the sweep's signal, gets SIGTERM (it checkpoints), and the outcome
        is STOPPED, as it is when the process exits with its preemption
        code.
      poll_seconds: Wait between looks at the run's record.
    """
    files.makedirs(self._model_dir)
    log_path = self._log_path
    if log_path != self._log:
      files.makedirs(os.path.dirname(log_path))
      if not files.exists(log_path) and files.exists(self._log):
        # Resumed on another machine: the log goes on from the URL's.
        files.copy(self._log, log_path)
    start = time.monotonic()
    with open(log_path, "a") as log:  # local-path: `log_path` is local
      offset = log.tell()
      if self._launcher:
        process = subprocess.Popen(
            self._launch_argv(), stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(os.environ, PYTHONUNBUFFERED="1"))
      else:
        # One started ahead if there is one alive, else one started now.
        python = (self._python if self._python is not None and
                  self._python.alive else warm.WarmPython(trial=True))
        process = python.run(self._argv[1:], log=log_path)
    self._process = process
    reported = set()
    pruned = stopped = False
    # The step of a pruner's stop that came after the run's final
    # evaluation (the pruner reads the evaluations as the sweep polls: a
    # short run may end in between): such a run is let finish, not told to
    # save and resume.
    late = None
    copied = time.monotonic()
    while not _exited(process, poll_seconds):
      if (log_path != self._log and
          time.monotonic() - copied >= LOG_COPY_SECONDS):
        copied = time.monotonic()
        try:
          files.copy(log_path, self._log)
        except Exception as e:  # pylint: disable=broad-except
          # The store out of reach a while (TensorFlow's errors, not
          # OSError): the trial goes on, the next copy is whole.
          console.warning(f"sweep | {self._log} not copied ({type(e).__name__}"
                          f"); the log is whole in {log_path}")
      if stop.is_set():
        stopped = True
        if not self._signalled:  # Started as the sweep stopped.
          self.signal(signal.SIGTERM)
        break
      for step, value in sorted(
          evaluations(self._model_dir, self._metric).items()):
        if step not in reported:
          reported.add(step)
          if not report(step, value) or late is not None:
            continue
          if (process.poll() is not None or _evaluated_last_step(
              self._model_dir, self._metric,
              _total_steps(log_path, offset))):
            late = step
            continue
          pruned = True
          process.send_signal(signal.SIGTERM)
          break
      if pruned:
        break
    returncode = process.wait()
    if not pruned:
      # Evaluations recorded after the last poll (the run ended before
      # the next): reported now, so that the study (the table, results.csv)
      # holds the evaluation the outcome quotes. The process is gone: the
      # pruner's verdict no longer matters.
      for step, value in sorted(
          evaluations(self._model_dir, self._metric).items()):
        if step not in reported:
          reported.add(step)
          report(step, value)
    total = _total_steps(log_path, offset)
    finished = _evaluated_last_step(self._model_dir, self._metric, total)
    if pruned and finished:
      # The SIGTERM landed after the final evaluation: nothing was spared.
      pruned, late = False, max(reported)
    if not (returncode == 0 or
            finished and returncode == self._preemption_exit_code):
      late = None
    outcome = self._outcome(returncode, time.monotonic() - start,
                            _tail(log_path, offset), reported, pruned,
                            stopped, late)
    if outcome.state == PRUNED and total == outcome.step:
      # The SIGTERM came in the run's last loop: train.py's line above
      # offers its final evaluation, which a pruned trial does not get.
      with open(log_path, "a") as log:  # local-path: `log_path` is local
        log.write(f"sweep | {outcome.cause}: the SIGTERM was the "
                  "pruner's; the trial is over.\n")
    if log_path != self._log:
      files.copy(log_path, self._log)
    return outcome

  def _outcome(self, returncode: int, seconds: float, lines: List[str],
               reported: Set[int], pruned: bool, stopped: bool,
               late: Optional[int] = None) -> Outcome:
    """The outcome of a process that exited with `returncode`, its log's
    new `lines` and the evaluations `reported` to the pruner; `late`: the
    step of a pruner's stop that came after the final evaluation."""
    step = _last_step(lines)
    found = evaluations(self._model_dir, self._metric)
    last = found[max(found)] if found else None
    if pruned:
      # The value the pruner judged, not a later evaluation the run made
      # before the SIGTERM landed: the live line, the table and the CSV
      # (Optuna's last intermediate value) quote the same number.
      at = max(reported)
      value = found.get(at)
      shown = "-" if value is None else f"{value:.4f}"
      return Outcome(PRUNED, value, step, seconds,
                     f"pruned at step {at}, where its {self._metric} was "
                     f"{shown}")
    if late is not None:
      # Finished, or stopped by the pruner's SIGTERM after its final
      # evaluation (`run`): complete, whatever the pruner said.
      returncode = 0
    elif stopped or returncode == self._preemption_exit_code:
      # Preempted (the sweep stopped, or a scheduler signalled the job):
      # checkpoint saved, to be resumed.
      return Outcome(STOPPED, last, step, seconds)
    if returncode < 0:  # Killed by a signal it had no handler for.
      # Its last evaluation, step and metric, as the study has it; the
      # cause says how far it got. Both from its records: its log's last
      # step may be a loop's past that evaluation.
      return Outcome(KILLED, last, max(found, default=0), seconds,
                     killed_cause(-returncode,
                                  _reached_step(self._model_dir, found)))
    if returncode != 0:
      return Outcome(FAIL, last, step, seconds, cause(lines, returncode))
    if last is None:
      return Outcome(FAIL, None, step, seconds,
                     f"the run ended without an evaluation of "
                     f"`{self._metric}`")
    if last != last:  # NaN
      return Outcome(FAIL, None, step, seconds,
                     f"`{self._metric}` is nan at step {max(found)}")
    return Outcome(COMPLETE, last, max(step, max(found)), seconds,
                   "" if late is None else
                   f"the pruner's stop at step {late} came after its final "
                   "evaluation")

  def _launch_argv(self) -> List[str]:
    argv = launch(self._launcher, self._argv)
    if not sys.platform.startswith("linux"):
      return argv
    return [sys.executable, "-c", _LAUNCHER_PRELUDE, str(os.getpid()), *argv]


def launch(launcher: Sequence[str], argv: Sequence[str]) -> List[str]:
  """`argv` (a `command()`) run with this Python under `launcher`, e.g.
  `srun --ntasks=2 --overlap python train.py ...`."""
  return [*launcher, sys.executable, *argv[1:]]
