"""`checkpoint_saves`: saves at interval multiples, once per step, never of
non-finite variables nor into a replaced model_dir."""

import os

import pytest
import tensorflow as tf

from trainer import errors
from trainer.loop.control import checkpoint_saves
from trainer.loop.control import rollback
from trainer.storage import files
from trainer.storage import lease


def _saves(tmp_path, interval=10, manager_interval=None, finite=True):
  step = tf.Variable(0, dtype=tf.int64)
  manager = tf.train.CheckpointManager(
      tf.train.Checkpoint(step=step), str(tmp_path), max_to_keep=None,
      checkpoint_interval=manager_interval, step_counter=step)
  saves = checkpoint_saves.CheckpointSaves(
      rollback.NonFiniteGuard(finite_fn=lambda: finite), interval, None,
      lambda: manager)
  saves.restored(0, None)
  saves.watch_directory()
  return saves


def _saved_steps(directory):
  state = tf.train.get_checkpoint_state(str(directory))
  return [int(p.rsplit("-", 1)[1]) for p in state.all_model_checkpoint_paths]


def test_saves_when_the_step_crosses_a_multiple(tmp_path, capsys):
  saves = _saves(tmp_path)
  assert [saves.save_if_due(step) for step in (5, 12, 15, 20, 31)] == [
      False, True, False, True, True]
  assert _saved_steps(tmp_path) == [12, 20, 31]
  assert (saves.last_saved_step, saves.newest_step) == (31, 31)
  assert capsys.readouterr().out.splitlines() == [
      f"saved checkpoint {tmp_path / 'ckpt'}-{step}" for step in (12, 20, 31)]
  assert saves.newest() == str(tmp_path / "ckpt-31")


def test_the_next_due_step_is_the_next_multiple_after_a_save(tmp_path):
  saves = _saves(tmp_path)
  assert saves.next_due == 10
  due = []
  for step in (5, 12, 15, 20, 31):
    # The controller asks only from `next_due` on: the same saves.
    if step >= saves.next_due:
      saves.save_if_due(step)
    due.append(saves.next_due)
  assert due == [10, 20, 20, 30, 40]
  assert _saved_steps(tmp_path) == [12, 20, 31]
  saves.restored(7, None)  # A rollback to step 7.
  assert saves.next_due == 10
  assert _saves(tmp_path / "none", interval=None).next_due == float("inf")


def test_a_final_save_is_once_per_step_unless_forced(tmp_path):
  saves = _saves(tmp_path)
  assert saves.save_if_due(5, check_interval=False)
  assert not saves.save_if_due(5, check_interval=False)
  assert saves.save_if_due(5, check_interval=False, force=True)


def test_the_interval_is_the_managers_unless_given(tmp_path):
  assert _saves(tmp_path / "a", interval=None, manager_interval=4
                ).interval() == 4
  assert _saves(tmp_path / "b", interval=6, manager_interval=4
                ).interval() == 6
  saves = _saves(tmp_path / "c", interval=None)
  assert saves.interval() is None
  assert not saves.save_if_due(100, check_interval=False)


def test_no_save_of_nonfinite_variables(tmp_path):
  saves = _saves(tmp_path, finite=False)
  with pytest.raises(errors.NonFiniteError):
    saves.save_if_due(10)
  assert saves.save_while_waiting(lambda: True, lambda: 10) == (
      "step 10 is not saved (variables are not finite at step 10; not saved "
      "(the newest checkpoint is step 0).)")
  assert saves.newest() is None


def test_no_save_into_a_replaced_model_dir(tmp_path):
  directory = tmp_path / "run"
  os.makedirs(directory)
  saves = _saves(directory)
  os.rename(directory, tmp_path / "old")  # Kept: its inode is not reused.
  os.makedirs(directory)
  with pytest.raises(errors.RunError) as raised:
    saves.save_if_due(10)
  assert str(raised.value) == (
      f"model_dir {directory} was deleted or replaced during the run; the "
      "checkpoint of step 10 is not saved.")


def test_a_save_while_waiting_is_said_in_words(tmp_path):
  saves = _saves(tmp_path)
  assert saves.save_while_waiting(lambda: False, lambda: 7) is None
  assert saves.save_while_waiting(lambda: True, lambda: 7) == (
      "the checkpoint of step 7 is saved")
  assert saves.save_while_waiting(lambda: True, lambda: 7) == (
      "the checkpoint of step 7 is saved")
  assert _saved_steps(tmp_path) == [7]
  steps = iter([8, 9])  # The loop moved during the save.
  assert saves.save_while_waiting(lambda: True, lambda: next(steps)) is None
  assert saves.newest_step == 7
  nothing_kept = checkpoint_saves.CheckpointSaves(
      rollback.NonFiniteGuard(), None, None, lambda: None)
  assert nothing_kept.save_while_waiting(lambda: True, lambda: 3) == (
      "no checkpoint is kept (steps to 3 are not saved)")


def test_a_save_broken_by_a_newer_holder_names_it(tmp_path, monkeypatch):
  """On an object store a second run may take the lease after the check and
  remove this save's `_temp` folder as a killed save's: TensorFlow's rename
  then fails with NotFound, and the error names the newer holder instead."""
  directory = f"ram://{tmp_path.name}/run"
  files.makedirs(directory)
  files.mark_directory(directory)
  first = lease.Lease(directory, [lease.TRAINER], "train", warn=print)
  first.acquire()
  saves = _saves(directory)
  mine = dict(lease._OBJECT_LEASES[directory])  # pylint: disable=protected-access
  manager = saves._manager_fn()  # pylint: disable=protected-access

  def save_while_taken(**_):
    lease.Lease(directory, [lease.TRAINER], "train", warn=print).acquire()
    monkeypatch.setitem(lease._OBJECT_LEASES, directory, mine)  # pylint: disable=protected-access
    raise tf.errors.NotFoundError(None, None, "404 when renaming ckpt-10_temp")

  monkeypatch.setattr(manager, "save", save_while_taken)
  with pytest.raises(errors.RunError) as raised:
    saves.save_if_due(10)
  assert str(raised.value).startswith(
      f"model_dir {directory} was taken by pid {os.getpid()} on host ")
  assert saves.last_saved_step == 0
  # Not taken: TensorFlow's own error goes on unchanged.
  monkeypatch.setitem(lease._OBJECT_LEASES, directory, {})  # pylint: disable=protected-access

  def save_failing(**_):
    raise tf.errors.NotFoundError(None, None, "404 when renaming ckpt-10_temp")

  monkeypatch.setattr(manager, "save", save_failing)
  with pytest.raises(tf.errors.NotFoundError):
    saves.save_if_due(10)
