"""`NonFiniteGuard`: the non-finite loss policy, alone, with fake callbacks
(the controller's use of it is in test_controller.py and test_resume.py)."""

import pytest

from trainer import errors
from trainer.loop.control import rollback


def test_stop_names_the_step_and_the_newest_checkpoint():
  guard = rollback.NonFiniteGuard("stop")
  with pytest.raises(errors.NonFiniteError) as raised:
    guard.start_rollback(17, last_saved_step=10, has_checkpoint=True)
  assert str(raised.value) == (
      "the training loss is not finite at step 17; the newest checkpoint "
      "(step 10) was saved before it and holds finite values.")
  assert raised.value.step == 17


def test_rollbacks_until_used_up(capsys):
  resumed = []
  guard = rollback.NonFiniteGuard("rollback", max_rollbacks=1,
                                  resume_input_fn=resumed.append)
  guard.start_rollback(17, last_saved_step=10, has_checkpoint=True)
  guard.finish_rollback(10)
  assert resumed == [10] and guard.rollbacks == 1
  assert capsys.readouterr().out == (
      "train | non-finite loss at step 17: rolled back to step 10, skipping "
      "that step's batch (rollback 1 of 1)\n")
  with pytest.raises(errors.NonFiniteError,
                     match=r"at step 19 after 1 rollback\(s\); no "
                     r"checkpoint was saved before it\."):
    guard.start_rollback(19, last_saved_step=0, has_checkpoint=False)


def test_loops_end_before_the_skipped_batch_which_is_discarded_once(capsys):
  discarded = []
  guard = rollback.NonFiniteGuard("rollback", max_rollbacks=3)
  assert guard.clip(10, 5, lambda: discarded.append(1)) == 5
  guard.start_rollback(17, last_saved_step=10, has_checkpoint=True)
  capsys.readouterr()
  # From step 10, loops of 5 stop at step 16, before the batch of step 17.
  assert guard.clip(10, 5, lambda: discarded.append(1)) == 5
  assert guard.clip(15, 5, lambda: discarded.append(1)) == 1
  assert discarded == []
  assert guard.clip(16, 4, lambda: discarded.append(1)) == 4
  assert discarded == [1]
  assert capsys.readouterr().out == "train | skipped the batch of step 17\n"
  assert guard.clip(20, 5, lambda: discarded.append(1)) == 5
  assert discarded == [1]


def test_no_save_of_non_finite_variables():
  finite = [True]
  guard = rollback.NonFiniteGuard(finite_fn=lambda: finite[0])
  guard.check_saveable(30, last_saved_step=20)
  finite[0] = False
  with pytest.raises(errors.NonFiniteError, match=(
      r"^variables are not finite at step 30; not saved \(the newest "
      r"checkpoint is step 20\)\.$")):
    guard.check_saveable(30, last_saved_step=20)
