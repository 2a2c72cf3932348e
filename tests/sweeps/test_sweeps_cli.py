"""trainer/sweeps/cli.py's sweep on a URL sweep directory, in-process (the
checks and the dry run stood in for, each trial a fake): what it writes
lands at the URL, where its lines say. (`test_cli.py` is train.py's.)"""

import os
import re

import pytest

from trainer import errors
from trainer.storage import files
from trainer.sweeps import cli
from trainer.sweeps import journal
from trainer.sweeps import locks
from trainer.sweeps import plot
from trainer.sweeps import report
from trainer.sweeps import space as space_lib
from trainer.sweeps import study as study_lib
from trainer.sweeps import trial_run
from trainer.sweeps import worker

SPACE = space_lib.parse_space(["a.b=[1, 2]"])


class FakeProcess:
  """Stands for `trial_run.TrialProcess`: a trial completes at once with
  the value of its `a.b` over 4."""

  def __init__(self, argv, model_dir, metric, preemption_exit_code=42,
               launcher=(), python=None, log_path=None):
    del model_dir, metric, preemption_exit_code, launcher, python, log_path
    (binding,) = [a for a in argv if a.startswith("--gin_param=a.b=")]
    self._value = int(binding.rsplit("=", 1)[1]) / 4

  def signal(self, signum):
    del signum

  def run(self, report_, stop, poll_seconds):
    del report_, stop, poll_seconds
    return trial_run.Outcome(trial_run.COMPLETE, self._value, 40, 1.0)


@pytest.fixture
def sweep_flags(url_sweep_dir, monkeypatch):
  """The sweep's flags parsed, `prepare` (the checks, the dry run) stood
  in for, trials faked; the flags unparsed afterwards."""
  # Each flag parsed on its own, not `FLAGS(argv)`: that runs every
  # validator of the process's one FlagValues, and another module imported
  # in this pytest worker (scripts/data_service.py requires --port) would
  # fail it.
  for name, value in (("sweep_dir", url_sweep_dir), ("metric", "accuracy"),
                      ("space", "a.b=[1, 2]"), ("n_trials", "2"),
                      ("gin_file", "x.gin")):
    cli.FLAGS[name].parse(value)
  cli.FLAGS.mark_as_parsed()
  plan = worker.Plan(sweep_dir=url_sweep_dir, space=tuple(SPACE),
                     metric="accuracy", gin_files=("x.gin",), gin_params=(),
                     mode="train_and_eval", total=2)
  wanted = study_lib.identity(SPACE, "accuracy", "maximize", ["x.gin"], [],
                              "train_and_eval")
  monkeypatch.setattr(cli, "prepare", lambda sweep_dir, ahead: (
      plan, wanted, study_lib.exists(sweep_dir, None)))
  monkeypatch.setattr(trial_run, "TrialProcess", FakeProcess)
  yield url_sweep_dir
  cli.FLAGS.unparse_flags()


def test_a_url_sweep_writes_its_results_and_journal_there(sweep_flags,
                                                          capsys):
  sweep_dir = sweep_flags
  assert cli.sweep(sweep_dir) == 0
  said = capsys.readouterr().out.splitlines()
  assert said[0] == (
      f"sweep | {sweep_dir}: journal kept at {journal.path(sweep_dir)} "
      "(Optuna's journal needs a local file system); copied to "
      f"{sweep_dir}/study.journal as each trial starts and ends")
  assert not files.is_url(journal.path(sweep_dir))
  assert f"sweep | results in {sweep_dir}/{report.CSV}" in said
  assert (f"sweep | accuracy against each binding in {sweep_dir}/"
          f"{plot.PNG}") in said
  assert re.fullmatch(
      r"best \| trial (\d) \| accuracy 0\.5000 \| python \S+train\.py "
      r"--gin_file=x\.gin --gin_param=a\.b=2 --mode=train_and_eval "
      rf"--model_dir={sweep_dir}/trial-\1", said[-1]), said[-1]
  names = files.listdir(sweep_dir)
  assert [name for name in names if not name.startswith("events.")] == [
      report.CSV, plot.PNG, "study.journal", "trial-0", "trial-1"]
  assert len(names) == 6  # The HParams experiment's event file.
  with open(journal.path(sweep_dir), "rb") as f:
    assert files.read_bytes(f"{sweep_dir}/study.journal") == f.read()
  # Rerun: all done, from the URL's journal on a machine without a copy.
  os.remove(journal.path(sweep_dir))
  assert cli.sweep(sweep_dir) == 0
  assert "2 of 2 trials done" in capsys.readouterr().out


def test_a_second_process_on_a_url_sweep_is_refused(sweep_flags):
  sweep_dir = sweep_flags
  with locks.alone(sweep_dir):
    with pytest.raises(errors.ConfigError, match=(
        "is swept by another process on this machine: sweep processes "
        "cannot share a URL --sweep_dir .* on a shared file system")):
      cli.sweep(sweep_dir)
