"""trainer/sweeps/study.py on a URL sweep directory: the study in a local
journal, found again from the URL's copy on another machine."""

import os

import optuna

from trainer.storage import files
from trainer.sweeps import journal
from trainer.sweeps import space as space_lib
from trainer.sweeps import study as study_lib

WANTED = study_lib.identity(space_lib.parse_space(["a.b=[1, 2]"]),
                            "accuracy", "maximize", ["x.gin"], [],
                            "train_and_eval")


def _open(sweep_dir):
  return study_lib.open_study(sweep_dir, None, WANTED,
                              optuna.samplers.RandomSampler(),
                              optuna.pruners.NopPruner())


def test_a_url_sweeps_study_is_found_again_on_another_machine(
    url_sweep_dir, tmp_path, monkeypatch):
  assert not study_lib.exists(url_sweep_dir, None)
  study = _open(url_sweep_dir)
  assert study.study_name == "sweep"  # The URL's last name.
  study.add_trial(optuna.trial.create_trial(value=0.5))
  local = journal.path(url_sweep_dir)
  assert os.path.isfile(local) and not files.is_url(local)
  assert not files.exists(journal.url_copy(url_sweep_dir))  # Not saved yet.
  journal.save(url_sweep_dir)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "other"))
  assert study_lib.exists(url_sweep_dir, None)
  again = study_lib.load(url_sweep_dir, None, repair=False)
  assert [t.value for t in again.trials] == [0.5]
  assert again.user_attrs["sweep"] == WANTED
  assert journal.path(url_sweep_dir) != local
