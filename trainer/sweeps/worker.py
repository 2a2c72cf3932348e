"""The sweep's workers: each claims a trial, runs it, and tells the study.

A worker claims, under the sweep's claims lock, either a trial left
RUNNING by a dead process (its trial lock is free: `trainer.sweeps.locks`), which
it resumes with the same number, bindings and model_dir, or a new trial
while the study has fewer than the total. So `--n_trials` counts each
trial once however often it is interrupted, and two workers, in one
process or several (`--parallel`, SLURM array tasks), never run the same
trial.

Each trial's model_dir records the configuration it was made for
(`trial.json`): a trial never runs in a directory made for other bindings
(a sweep that lost its study, say), but in a fresh one, `trial-<n>.<k>`.
A trial whose process a signal killed (SIGKILL: the OOM killer) stays
RUNNING, marked killed: a rerun resumes it from its checkpoint, up to
`KILL_RETRIES` times.

A URL sweep directory's trials have URL model_dirs (`gs://.../trial-<n>`);
their locks and, while they run, their output are local
(`warm.local_dir`), and the study's journal is copied to the URL as each
trial ends (`trainer.sweeps.journal`).
"""

import dataclasses
import errno
import itertools
import os
import signal
import threading
from typing import Any, Dict, List, Optional, Set, Tuple

import optuna
from optuna.trial import TrialState

from trainer import console
from trainer.storage import files
from trainer.sweeps import hparams
from trainer.sweeps import journal
from trainer.sweeps import locks
from trainer.sweeps import report
from trainer.sweeps import space as space_lib
from trainer.sweeps import trial_run
from trainer.sweeps import warm

# How long a resumed trial waits for its killed predecessor to save.
_TRAINER_WAIT_SECONDS = 300.0
# How often a rerun resumes a trial that a signal killed; killed once more,
# it is recorded FAIL.
KILL_RETRIES = 2
# In each trial's model_dir: the configuration it was made for.
RECORD = "trial.json"
_FULL = (errno.ENOSPC, errno.EDQUOT)


def disk_error(e: OSError) -> str:
  """The one line for a write the disk refused: full, or read-only."""
  where = e.filename or "the sweep directory"
  if e.errno in _FULL:
    return (f"{where}: {e.strerror or e}: free some space, then rerun the "
            "same command to continue.")
  return (f"{where}: {e.strerror or e}: a sweep writes its study, locks "
          "and trials in --sweep_dir; give one it can write (--report "
          "only reads).")


@dataclasses.dataclass(frozen=True)
class Plan:
  """What every worker runs.

  Attributes:
    sweep_dir: The trials' parent directory.
    space: The swept bindings.
    metric: The evaluation result optimised.
    gin_files: `--gin_file` of every trial.
    gin_params: `--gin_param` of every trial, before the trial's own.
    mode: `--mode` of every trial.
    total: How many trials the study holds at the end.
    stop_after_failures: Stop once this many trials failed and none
      completed or was pruned.
    preemption_exit_code: train.py's exit code after a SIGTERM.
    poll_seconds: Wait between looks at a running trial's evaluations.
    launcher: The command every trial's train.py runs under (e.g. `srun
      --ntasks=2 --overlap` for a multi-worker trial); empty: none.
  """
  sweep_dir: str
  space: Tuple[space_lib.Dimension, ...]
  metric: str
  gin_files: Tuple[str, ...]
  gin_params: Tuple[str, ...]
  mode: str
  total: int
  stop_after_failures: int = 3
  preemption_exit_code: int = 42
  poll_seconds: float = 1.0
  launcher: Tuple[str, ...] = ()


def _bindings(plan: Plan, params: Dict[str, object]) -> List[str]:
  return space_lib.gin_params({d.binding: params[d.binding]
                               for d in plan.space})


class Sweep:
  """Runs the plan's trials on a study, with any number of workers.

  Attributes:
    stop: Set to stop every worker (`interrupt` sets it); running trials
      checkpoint and stay RUNNING, to be resumed.
    first_failure: The first failed trial's line, once `stop_after_failures`
      trials failed and none did better; None otherwise.
    error: Why the sweep stopped early, as one line (a full or read-only
      disk, a trial directory made for other bindings); None otherwise.
    killed: The line of each trial a signal killed, to be resumed.
  """

  def __init__(self, study: optuna.Study, plan: Plan,
               spares: Optional[warm.Spares] = None):
    self._study = study
    self._plan = plan
    # Processes that loaded TensorFlow ahead (`trainer.sweeps.warm`); None under a
    # launcher, which starts its own.
    self._spares = spares
    self.stop = threading.Event()
    self.first_failure: Optional[str] = None
    self.error: Optional[str] = None
    self.killed: List[str] = []
    # Killed here: resumed by a rerun, not again by this process.
    self._killed: Set[int] = set()
    self._running: Set[trial_run.TrialProcess] = set()
    self._running_lock = threading.Lock()

  def interrupt(self, signum: int) -> None:
    """Stops the sweep on a signal: every running trial gets it at once
    (it saves a checkpoint and stays RUNNING, to be resumed)."""
    self.stop.set()
    with self._running_lock:
      for process in self._running:
        process.signal(signum)

  def run(self, parallel: int) -> None:
    """Runs `parallel` workers until no trial is left or `stop` is set."""
    workers = [threading.Thread(target=self._work, name=f"worker-{i}",
                                daemon=True) for i in range(parallel)]
    for worker in workers:
      worker.start()
    for worker in workers:
      while worker.is_alive():  # Short joins: signal handlers run between.
        worker.join(0.5)
    if self._spares is not None:
      self._spares.close()

  def _fail(self, line: str) -> None:
    """Stops the sweep on an error: running trials checkpoint and stay
    RUNNING, to be resumed once it is fixed."""
    with self._running_lock:
      if self.error is None:
        self.error = line
    self.interrupt(signal.SIGTERM)

  def _work(self) -> None:
    try:
      while not self.stop.is_set():
        claimed = self._claim()
        if claimed is None:
          return
        trial, lock, earlier = claimed
        try:
          # The claim too: a sweep killed in this trial is rerun elsewhere
          # from the URL's copy, which then resumes the trial, not starts
          # another in its model_dir.
          journal.save(self._plan.sweep_dir)
          self._run(trial, earlier)
          journal.save(self._plan.sweep_dir)
        finally:
          locks.release(lock)
    except OSError as e:  # A full or read-only disk: the study is as it was.
      self._fail(disk_error(e))

  def _record(self, params: Dict[str, Any]) -> Dict[str, Any]:
    """What a trial's model_dir is made for: its train.py configuration."""
    return {"gin_files": list(self._plan.gin_files),
            "gin_params": (list(self._plan.gin_params) +
                           _bindings(self._plan, params)),
            "mode": self._plan.mode}

  def _fresh_dir(self, number: int, record: Dict[str, Any]) -> str:
    """`trial-<n>`, or if a run of another configuration is there, the
    first `trial-<n>.<k>` free or made for `record`; records it there."""
    taken = None
    for k in itertools.count(1):
      name = f"trial-{number}" + (f".{k}" if k > 1 else "")
      path = os.path.join(self._plan.sweep_dir, name)
      found = _read_record(path)
      if found == record or not _used(path):
        break
      if taken is None:
        taken = f"{path} {_made_for(found, record)}"
    if taken:  # Left as it is: its run may be all that is left of it.
      console.info(f"sweep | trial {number}: {taken}: this trial runs in "
                   f"{path}")
    files.write_json(os.path.join(path, RECORD), record)
    return name

  def _claim(self) -> Optional[
      Tuple[optuna.Trial, int, Optional[optuna.trial.FrozenTrial]]]:
    """A trial to run, its lock, and the trial as a dead worker left it
    (None for a new trial)."""
    with locks.held(locks.claims(self._plan.sweep_dir)):
      trials = self._study.get_trials(deepcopy=False)
      for frozen in trials:
        if (frozen.state == TrialState.RUNNING and
            frozen.number not in self._killed):
          lock = locks.try_lock(locks.trial(self._plan.sweep_dir,
                                            report.dir_name(frozen)))
          if lock is not None:
            # Optuna's ask-and-tell has no public way back to a RUNNING
            # trial of the storage: its id is private.
            # pylint: disable-next=protected-access
            trial = optuna.Trial(self._study, frozen._trial_id)
            return trial, lock, frozen
      if len(trials) >= self._plan.total:
        return None
      trial = self._study.ask({dimension.binding: dimension.distribution()
                               for dimension in self._plan.space})
      name = self._fresh_dir(trial.number, self._record(trial.params))
      trial.set_user_attr("model_dir", name)
      lock = locks.try_lock(locks.trial(self._plan.sweep_dir, name))
      return trial, lock, None

  def _run(self, trial: optuna.Trial,
           earlier: Optional[optuna.trial.FrozenTrial]) -> None:
    plan = self._plan
    model_dir = report.model_dir(plan.sweep_dir, trial)
    bindings = _bindings(plan, trial.params)
    if earlier:
      record = self._record(trial.params)
      found = _read_record(model_dir)
      if found is not None and found != record:
        self._fail(f"trial {trial.number}: {model_dir} "
                   f"{_made_for(found, record)}, not {' '.join(bindings)}: "
                   "move it away, then rerun the same command.")
        return
      if found is None:  # Made before trial directories had a record.
        files.write_json(os.path.join(model_dir, RECORD), record)
      if earlier.user_attrs.get("killed"):
        trial.set_user_attr("killed", False)
    console.info(f"sweep | trial {trial.number} "
                 f"{'resume' if earlier else 'start'} | {' '.join(bindings)}"
                 f" | {model_dir}")
    if earlier:
      locks.wait_for_trainer(model_dir, _TRAINER_WAIT_SECONDS)
    else:
      hparams.write_session(model_dir, f"trial-{trial.number}", plan.space,
                            trial.params)
    reported = set(earlier.intermediate_values if earlier else ())

    def on_evaluation(step: int, value: float) -> bool:
      if step in reported:
        return False
      reported.add(step)
      trial.report(value, step)
      return trial.should_prune()

    python = None
    if self._spares is not None:
      more = len(self._study.get_trials(deepcopy=False)) < plan.total
      python = self._spares.take(more=more and not self.stop.is_set())
    local = {}
    if files.is_url(model_dir):  # A process writes its output locally.
      local["log_path"] = os.path.join(warm.local_dir(plan.sweep_dir),
                                       report.dir_name(trial), trial_run.LOG)
    process = trial_run.TrialProcess(
        trial_run.command(plan.gin_files, list(plan.gin_params) + bindings,
                          plan.mode, model_dir),
        model_dir, plan.metric, plan.preemption_exit_code,
        launcher=plan.launcher, python=python, **local)
    with self._running_lock:
      self._running.add(process)
    try:
      outcome = process.run(on_evaluation, self.stop, plan.poll_seconds)
    finally:
      with self._running_lock:
        self._running.discard(process)
    self._settle(trial, earlier, outcome, bindings, model_dir)

  def _settle(self, trial: optuna.Trial,
              earlier: Optional[optuna.trial.FrozenTrial],
              outcome: trial_run.Outcome, bindings: List[str],
              model_dir: str) -> None:
    """Records how the trial's process ended (in the study, and as its
    HParams session's end in `model_dir`), and says it."""
    plan = self._plan
    seconds = (earlier.user_attrs.get("seconds", 0.0) if earlier else 0.0
               ) + outcome.seconds
    trial.set_user_attr("seconds", round(seconds, 1))
    trial.set_user_attr("steps", outcome.step)
    cause = outcome.cause
    if outcome.state == trial_run.FAIL and trial_run.no_space(cause):
      # Not the trial's fault: it resumes once there is space.
      self._fail(f"trial {trial.number}: {cause}: free some space, then "
                 "rerun the same command to continue.")
      return
    if outcome.state == trial_run.KILLED:
      kills = (earlier.user_attrs.get("kills", 0) if earlier else 0) + 1
      trial.set_user_attr("kills", kills)
      if kills <= KILL_RETRIES:
        cause += (f"; rerun to resume it (retry {kills} of "
                  f"{KILL_RETRIES})")
      else:
        outcome.state = trial_run.FAIL
        cause += f" ({kills} times: not resumed again)"
    if cause or earlier and earlier.user_attrs.get("cause"):
      trial.set_user_attr("cause", cause)
    metric = ("-" if outcome.value is None else f"{outcome.value:.4f}")
    line = (f"sweep | trial {trial.number} {outcome.state} | {plan.metric} "
            f"{metric} | step {outcome.step} | {outcome.seconds:.1f} s | "
            f"{' '.join(bindings)}")
    if outcome.state == trial_run.STOPPED:
      self.stop.set()
      console.info(line + " | checkpoint saved; rerun to resume it")
      return
    console.info(line + (f" | {cause}" if cause else ""))
    if outcome.state == trial_run.KILLED:
      # Left RUNNING with its checkpoint; its lock is released on return.
      # No session end: the rerun resumes it.
      trial.set_user_attr("killed", True)
      self._killed.add(trial.number)
      self.killed.append(f"trial {trial.number} {cause}")
      return
    hparams.write_session_end(model_dir, outcome.state)
    if outcome.state == trial_run.COMPLETE:
      self._study.tell(trial, outcome.value)
    else:
      self._study.tell(trial, state=getattr(TrialState, outcome.state))
    self._check_failures()

  def killed_line(self) -> str:
    """The one line for the trials a signal killed (`killed`)."""
    if len(self.killed) == 1:
      return self.killed[0] + "."
    return (f"{len(self.killed)} trials were killed; {self.killed[0]}.")

  def _check_failures(self) -> None:
    """Stops the sweep once the first `stop_after_failures` trials to end
    all failed."""
    ended = [t for t in self._study.get_trials(deepcopy=False)
             if t.state.is_finished()]
    failed = sorted((t for t in ended if t.state == TrialState.FAIL),
                    key=lambda t: t.number)
    if len(failed) == len(ended) >= self._plan.stop_after_failures:
      first = failed[0]
      self.first_failure = (f"the first {len(failed)} trials failed; trial "
                            f"{first.number}: "
                            f"{first.user_attrs.get('cause', '?')}")
      self.stop.set()


def _read_record(model_dir: str) -> Optional[Dict[str, Any]]:
  """The configuration `model_dir` was made for; None if unrecorded."""
  try:
    found = files.read_json(os.path.join(model_dir, RECORD))
  except ValueError:  # Damaged: it proves nothing.
    return {}
  return found


def _used(model_dir: str) -> bool:
  """Whether `model_dir` holds anything besides a trial lock."""
  return bool(set(files.listdir(model_dir)) - {locks.TRIAL})


def _made_for(found: Optional[Dict[str, Any]],
              record: Dict[str, Any]) -> str:
  """`was made for a.b=1`: the bindings of `found` that `record` lacks."""
  if not found:
    return "holds a run with no record of its bindings"
  other = [param for param in found.get("gin_params", [])
           if param not in record["gin_params"]]
  return f"was made for {' '.join(other) or 'another configuration'}"
