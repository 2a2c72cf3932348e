"""trainer/sweeps/worker.py on a URL sweep directory: trials' model_dirs at
the URL, their locks and logs local, the journal copied as each trial
starts and ends."""

import json
import os

import optuna
# The journal's operation codes (the file format; not exported by optuna).
from optuna.storages.journal._storage import JournalOperation

from trainer.storage import files
from trainer.sweeps import journal
from trainer.sweeps import locks
from trainer.sweeps import space as space_lib
from trainer.sweeps import study as study_lib
from trainer.sweeps import trial_run
from trainer.sweeps import warm
from trainer.sweeps import worker

SPACE = space_lib.parse_space(["a.b=[1, 2]"])


class FakeProcess:
  """Stands for `trial_run.TrialProcess`: each run completes at once, its
  value the next of `VALUES`; `RUNS` lists what each was given."""
  VALUES = []
  RUNS = []

  def __init__(self, argv, model_dir, metric, preemption_exit_code=42,
               launcher=(), python=None, log_path=None):
    del argv, metric, preemption_exit_code, launcher, python
    self._model_dir, self._log_path = model_dir, log_path

  def signal(self, signum):
    del signum

  def run(self, report_, stop, poll_seconds):
    del report_, stop, poll_seconds
    # Its model_dir, its log, and how many trials the URL's copy of the
    # journal holds as it runs.
    copy = files.read_text(journal.url_copy(os.path.dirname(self._model_dir)))
    FakeProcess.RUNS.append((self._model_dir, self._log_path, sum(
        json.loads(line)["op_code"] == JournalOperation.CREATE_TRIAL
        for line in (copy or "").splitlines())))
    return trial_run.Outcome(trial_run.COMPLETE, FakeProcess.VALUES.pop(0),
                             40, 1.0)


def test_a_url_sweeps_trials_run_at_the_url_and_its_journal_follows(
    url_sweep_dir, monkeypatch):
  monkeypatch.setattr(trial_run, "TrialProcess", FakeProcess)
  FakeProcess.VALUES, FakeProcess.RUNS = [0.5, 0.75], []
  wanted = study_lib.identity(SPACE, "accuracy", "maximize", ["x.gin"], [],
                              "train_and_eval")
  study = study_lib.open_study(url_sweep_dir, None, wanted,
                               study_lib.sampler("grid", 0, SPACE),
                               optuna.pruners.NopPruner())
  plan = worker.Plan(sweep_dir=url_sweep_dir, space=tuple(SPACE),
                     metric="accuracy", gin_files=("x.gin",), gin_params=(),
                     mode="train_and_eval", total=2)
  runner = worker.Sweep(study, plan)
  runner.run(1)
  assert runner.error is None
  local = warm.local_dir(url_sweep_dir)
  # The journal was copied as each trial was claimed: a sweep killed in
  # it is rerun elsewhere from a copy that holds it.
  assert FakeProcess.RUNS == [
      (f"{url_sweep_dir}/trial-{n}",
       os.path.join(local, f"trial-{n}", trial_run.LOG), n + 1)
      for n in (0, 1)]
  for n in (0, 1):
    model_dir = f"{url_sweep_dir}/trial-{n}"
    assert files.read_json(f"{model_dir}/{worker.RECORD}")["mode"] == (
        "train_and_eval")
    # The HParams session and its end.
    assert len(files.matching(model_dir, "events.out.tfevents.*")) == 2
    assert os.path.exists(os.path.join(local, f"trial-{n}", locks.TRIAL))
  with open(journal.path(url_sweep_dir), "rb") as f:
    assert files.read_bytes(journal.url_copy(url_sweep_dir)) == f.read()
  assert [t.value for t in study_lib.load(url_sweep_dir, None).trials] == [
      0.5, 0.75]
