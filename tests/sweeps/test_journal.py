"""trainer/sweeps/journal.py on a URL sweep directory: a local journal,
copied whole to the URL, brought back where the local copy has less."""

import os

import optuna
import pytest
import tensorflow as tf

from trainer import console
from trainer import errors
from trainer.storage import files
from trainer.sweeps import journal


def _study(sweep_dir, trials=0):
  """A study in `sweep_dir`'s journal with `trials` complete trials."""
  study = optuna.create_study(storage=journal.Storage(journal.path(sweep_dir)),
                              study_name="sweep", load_if_exists=True)
  for value in range(trials):
    study.add_trial(optuna.trial.create_trial(value=float(value)))
  return study


def test_a_local_sweep_keeps_its_journal_in_it(tmp_path):
  sweep_dir = str(tmp_path / "sweep")
  assert journal.path(sweep_dir) == os.path.join(sweep_dir, "study.journal")
  assert journal.url_copy(sweep_dir) is None
  os.makedirs(sweep_dir)
  _study(sweep_dir, trials=1)
  journal.save(sweep_dir)
  journal.restore(sweep_dir)
  assert sorted(os.listdir(sweep_dir)) == ["study.journal"]


def test_a_url_sweeps_journal_is_local_and_saved_to_the_url_whole(
    url_sweep_dir, tmp_path):
  local = journal.path(url_sweep_dir)
  assert local.startswith(str(tmp_path / "cache" / "trainer" / "sweeps") +
                          os.sep)
  assert os.path.basename(os.path.dirname(local)).startswith(
      f"ram_{tmp_path.name}_sweep-")
  assert journal.url_copy(url_sweep_dir) == url_sweep_dir + "/study.journal"
  journal.save(url_sweep_dir)  # No journal yet: nothing.
  assert not files.exists(journal.url_copy(url_sweep_dir))
  os.makedirs(os.path.dirname(local))
  _study(url_sweep_dir, trials=2)
  journal.save(url_sweep_dir)
  with open(local, "rb") as f:
    assert files.read_bytes(journal.url_copy(url_sweep_dir)) == f.read()


def test_another_machine_continues_from_the_urls_copy(
    url_sweep_dir, tmp_path, monkeypatch):
  os.makedirs(os.path.dirname(journal.path(url_sweep_dir)))
  _study(url_sweep_dir, trials=2)
  journal.save(url_sweep_dir)
  first = journal.path(url_sweep_dir)
  # A new machine: no local copy, until the URL's is brought.
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "other"))
  assert not os.path.exists(journal.path(url_sweep_dir))
  journal.restore(url_sweep_dir)
  assert len(_study(url_sweep_dir).trials) == 2
  _study(url_sweep_dir, trials=1)  # One more trial there.
  journal.save(url_sweep_dir)
  # Back on the first machine, whose copy is older: the URL's replaces it.
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  assert journal.path(url_sweep_dir) == first
  journal.restore(url_sweep_dir)
  assert len(_study(url_sweep_dir).trials) == 3
  # A copy that goes further (killed before it saved) is kept.
  _study(url_sweep_dir, trials=1)
  journal.restore(url_sweep_dir)
  assert len(_study(url_sweep_dir).trials) == 4


def test_copies_gone_separate_ways_are_refused(url_sweep_dir, tmp_path,
                                                monkeypatch):
  os.makedirs(os.path.dirname(journal.path(url_sweep_dir)))
  _study(url_sweep_dir, trials=1)
  journal.save(url_sweep_dir)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "other"))
  journal.restore(url_sweep_dir)
  _study(url_sweep_dir, trials=1)
  journal.save(url_sweep_dir)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  _study(url_sweep_dir, trials=2)  # Meanwhile, on the first machine.
  with pytest.raises(errors.ConfigError) as raised:
    journal.restore(url_sweep_dir)
  assert str(raised.value) == (
      f"the journal of {url_sweep_dir} and this machine's copy "
      f"({journal.path(url_sweep_dir)}) went separate ways (two machines "
      "swept it at once?): move the copy away to continue from the URL's.")


def test_a_copy_that_fails_is_said_and_the_sweep_goes_on(url_sweep_dir,
                                                         monkeypatch):
  os.makedirs(os.path.dirname(journal.path(url_sweep_dir)))
  _study(url_sweep_dir, trials=1)
  said = []
  monkeypatch.setattr(console, "warning", said.append)

  def unreachable(path, data, root=None):
    raise tf.errors.UnavailableError(None, None, "connection reset\nmore")

  monkeypatch.setattr(files, "write_bytes", unreachable)
  journal.save(url_sweep_dir)
  assert said == [
      f"sweep | {url_sweep_dir}/study.journal not copied (UnavailableError: "
      f"connection reset); the journal is whole in "
      f"{journal.path(url_sweep_dir)}, copied again after the next trial"]
