"""The lease on model_dir: one trainer and one evaluator at a time, real
processes included; a crashed holder blocks no one."""

import errno
import json
import os
import signal
import socket
import subprocess
import sys

import pytest

import trainer
from trainer import actions
from trainer import errors
from trainer import experiment
from trainer.storage import files
from trainer.storage import lease

import helpers

# Holds a lease until its stdin closes. It skips `trainer/__init__`, which
# imports TensorFlow (6 s): `trainer.lease` needs only `trainer.errors` and
# `trainer.console`.
_HOLDER = """
import sys, types
package = types.ModuleType("trainer")
package.__path__ = [sys.argv[1]]
sys.modules["trainer"] = package
from trainer.storage import files
from trainer.storage import lease
with lease.Lease(sys.argv[2], [sys.argv[3]], "train_and_eval"):
  print("held", flush=True)
  sys.stdin.read()
"""


def _holder(directory, role=lease.TRAINER):
  """Starts a process holding `role`'s lease on `directory`."""
  process = subprocess.Popen(
      [sys.executable, "-c", _HOLDER,
       os.path.join(helpers.REPO_ROOT, "trainer"), str(directory), role],
      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
  assert process.stdout.readline() == "held\n"
  return process


def _recorded(directory, role=lease.TRAINER):
  with open(lease.lock_path(str(directory), role)) as f:
    return json.load(f)


def _in_use(holder, writes="writing checkpoints"):
  return (f"model_dir is in use by pid {holder['pid']} on host "
          f"{socket.gethostname()} since {holder['since']} "
          f"({holder['mode']}, {writes}); stop it first, or use another "
          "--model_dir.")


def test_a_second_process_is_refused_until_the_holder_ends(tmp_path):
  holder = _holder(tmp_path)
  try:
    recorded = _recorded(tmp_path)
    assert (recorded["pid"], recorded["mode"]) == (holder.pid,
                                                   "train_and_eval")
    with pytest.raises(errors.ConfigError) as refused:
      lease.Lease(str(tmp_path), [lease.TRAINER], "train").acquire()
    assert str(refused.value) == _in_use(recorded)
    assert _recorded(tmp_path) == recorded  # The refused one wrote nothing.
  finally:
    holder.communicate("")
  # Released on exit: the file is gone and the lease free.
  assert not os.listdir(tmp_path)
  with lease.Lease(str(tmp_path), [lease.TRAINER], "train") as taken:
    assert taken.held == [lease.TRAINER]
    assert _recorded(tmp_path)["pid"] == os.getpid()
  assert not os.listdir(tmp_path)


def test_a_killed_holders_file_blocks_no_one(tmp_path):
  holder = _holder(tmp_path)
  holder.kill()
  holder.communicate()
  assert _recorded(tmp_path)["pid"] == holder.pid  # Stale, left behind.
  with lease.Lease(str(tmp_path), [lease.TRAINER], "train"):
    assert _recorded(tmp_path)["pid"] == os.getpid()


def test_one_trainer_and_one_evaluator_never_two_of_a_role(tmp_path):
  directory = str(tmp_path)
  with lease.Lease(directory, [lease.EVALUATOR], "continuous_eval"):
    with lease.Lease(directory, [lease.TRAINER], "train") as training:
      assert training.held == [lease.TRAINER]
    both = lease.Lease(directory, [lease.TRAINER, lease.EVALUATOR],
                       "train_and_eval")
    with pytest.raises(errors.ConfigError,
                       match=r"\(continuous_eval, writing evaluation "
                       r"records\); stop it first"):
      both.acquire()
    # All or nothing: the trainer's lease taken first was given back.
    assert both.held == [] and os.listdir(directory) == [".evaluator.lock"]


def test_without_a_record_the_holder_is_another_process():
  assert lease.in_use_message(None, lease.TRAINER) == (
      "model_dir is in use by another process; stop it first, or use another "
      "--model_dir.")


def test_no_lease_and_a_warning_where_locks_do_not_work(tmp_path,
                                                        monkeypatch):
  warnings = []

  def refuse(fd, operation):
    del fd, operation
    raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

  monkeypatch.setattr(lease.fcntl, "flock", refuse)
  with lease.Lease(str(tmp_path), [lease.TRAINER], "train",
                   warn=warnings.append) as unlocked:
    assert unlocked.held == []
  assert warnings == [
      f"{tmp_path}: the filesystem does not support locks (No locks "
      "available): no lease keeps a second run from writing it at the same "
      "time; make sure only one does."]


def test_on_a_url_the_newer_holder_stops_the_earlier_at_its_next_save(
    tmp_path, monkeypatch):
  """An object store gives no lock: each holder writes its record into the
  lease object; the one whose record was replaced stops at `verify` (each
  checkpoint save), naming the newer one, and leaves the newer's record."""
  monkeypatch.chdir(tmp_path)
  directory = f"ram://{tmp_path.name}/run"
  warnings = []
  first = lease.Lease(directory, [lease.TRAINER], "train",
                      warn=warnings.append)
  first.acquire()
  assert first.held == [lease.TRAINER] and warnings == []
  record = files.read_json(lease.lock_path(directory, lease.TRAINER))
  assert record["pid"] == os.getpid() and record["mode"] == "train"
  lease.verify(directory)  # Its own: nothing to say.

  second = lease.Lease(directory, [lease.TRAINER], "train_and_eval",
                       warn=warnings.append)
  second.acquire()
  holder = (f"pid {os.getpid()} on host {record['host']} since "
            f"{record['since']} (train)")
  assert warnings == [
      f"{directory}: {holder} left its trainer lease there: it was killed, "
      "or it still runs. An object store gives no lock: if it runs, the "
      "earlier of the two stops at its next checkpoint save."]
  newer = files.read_json(lease.lock_path(directory, lease.TRAINER))
  assert newer["token"] != record["token"]
  # The process-wide record is the newer holder's now; the earlier one
  # checks its own token, as it would in its own process.
  monkeypatch.setitem(lease._OBJECT_LEASES, directory, first._tokens)  # pylint: disable=protected-access
  with pytest.raises(errors.RunError) as raised:
    lease.verify(directory)
  assert str(raised.value) == (
      f"model_dir {directory} was taken by pid {os.getpid()} on host "
      f"{newer['host']} since {newer['since']} (train_and_eval): two runs "
      "were writing it. This one stops here; its checkpoints so far are "
      "kept. Stop the other, or give each its own --model_dir.")
  first.release()  # Leaves the newer holder's record.
  assert files.read_json(lease.lock_path(directory, lease.TRAINER)) == newer
  second.release()
  assert not files.exists(lease.lock_path(directory, lease.TRAINER))
  assert os.listdir(tmp_path) == []  # Nothing written locally.


def test_by_default_the_warning_is_a_console_warning(tmp_path, capsys):
  directory = f"ram://{tmp_path.name}/run"
  files.write_text(lease.lock_path(directory, lease.TRAINER), "not json")
  files.write_json(lease.lock_path(directory, lease.EVALUATOR),
                   {"pid": 7, "host": "h", "since": "s", "mode": "eval"})
  with lease.Lease(directory, [lease.TRAINER, lease.EVALUATOR],
                   "train_and_eval") as remote:
    assert remote.held == [lease.TRAINER, lease.EVALUATOR]
  assert capsys.readouterr().out == (
      f"warning | {directory}: pid 7 on host h since s (eval) left its "
      "evaluator lease there: it was killed, or it still runs. An object "
      "store gives no lock: if it runs, the earlier of the two stops at its "
      "next checkpoint save.\n")


def _config(train_steps, **settings):
  return trainer.TrainerConfig(
      train_steps=train_steps, steps_per_loop=10, summary_interval=10,
      checkpoint_interval=10, global_batch_size=32, **settings)


@pytest.mark.parametrize("held,mode,settings,refused", [
    (lease.TRAINER, "train", {}, True),
    (lease.TRAINER, "eval", {}, False),
    (lease.EVALUATOR, "train", {}, False),
    (lease.EVALUATOR, "continuous_eval", {}, True),
    (lease.EVALUATOR, "eval", {}, False),
    (lease.EVALUATOR, "eval",
     dict(best_checkpoint=actions.BestCheckpointConfig("loss", False)), True),
])
def test_which_modes_a_held_lease_refuses(tmp_path, held, mode, settings,
                                          refused):
  model_dir = str(tmp_path)
  task = helpers.LinearRegression()
  runtime = trainer.RuntimeConfig(seed=0)
  experiment.run(task, "train", model_dir, runtime, _config(10))
  with lease.Lease(model_dir, [held], "train_and_eval"):
    before = helpers.snapshot(model_dir)
    if refused:
      with pytest.raises(errors.ConfigError, match="^model_dir is in use by "
                         f"pid {os.getpid()} "):
        experiment.run(task, mode, model_dir, runtime,
                       _config(10, continuous_eval_timeout=1, **settings))
      assert helpers.snapshot(model_dir) == before
    else:
      experiment.run(task, mode, model_dir, runtime,
                     _config(20, continuous_eval_timeout=1, **settings))


_TRAIN = ["--gin_file=gin/digits.gin",
          "--gin_param=trainer.steps_per_loop=10",
          "--gin_param=trainer.summary_interval=10",
          "--gin_param=trainer.checkpoint_interval=50",
          "--gin_param=trainer.validation_interval=0"]


@pytest.fixture(scope="module")
def stopped_trainer(tmp_path_factory):
  """A trainer that has saved a checkpoint, stopped (SIGSTOP) so that it
  writes nothing more while it holds the lease: (process, model_dir)."""
  model_dir = str(tmp_path_factory.mktemp("held"))
  process = helpers.TrainProcess(
      _TRAIN + [f"--model_dir={model_dir}",
                "--gin_param=trainer.train_steps=1000000"])
  try:
    process.wait_for(r"^saved checkpoint ")
    os.kill(process.process.pid, signal.SIGSTOP)
    yield process, model_dir
  finally:
    if process.process.poll() is None:
      os.kill(process.process.pid, signal.SIGCONT)
    process.close()


def test_a_second_trainer_exits_naming_the_first_and_changes_nothing(
    stopped_trainer):
  first, model_dir = stopped_trainer
  # As if the first were saving: a second trainer that cleaned up
  # interrupted saves would delete it.
  os.makedirs(os.path.join(model_dir, "ckpt-999999_temp"))
  with open(os.path.join(model_dir, "ckpt-999999_temp", "shard"), "w") as f:
    f.write("being written")
  before = helpers.snapshot(model_dir)
  second = helpers.run_cli(_TRAIN + [f"--model_dir={model_dir}",
                                     "--gin_param=trainer.train_steps=100"])
  assert second.returncode == 2, second.stderr[-3000:]
  holder = _recorded(model_dir)
  assert holder["pid"] == first.process.pid
  assert second.stderr.strip().splitlines()[-1] == (
      f"train.py: error: {_in_use(holder)}")
  assert "Traceback" not in second.stderr
  assert helpers.snapshot(model_dir) == before


def test_a_plain_eval_runs_beside_a_trainer(stopped_trainer):
  _, model_dir = stopped_trainer
  result = helpers.run_cli(_TRAIN + [f"--model_dir={model_dir}",
                                     "--mode=eval"])
  assert result.returncode == 0, result.stderr[-3000:]
  assert "final eval | accuracy " in result.stdout


def test_after_the_trainer_is_killed_the_next_one_resumes(stopped_trainer):
  first, model_dir = stopped_trainer
  first.process.kill()
  first.close()
  assert _recorded(model_dir)["pid"] == first.process.pid  # Stale.
  step = helpers.checkpoint_step(model_dir)
  result = helpers.run_cli(_TRAIN + [
      f"--model_dir={model_dir}",
      f"--gin_param=trainer.train_steps={step + 20}"])
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"restored checkpoint {model_dir}/ckpt-{step} at step {step}" in (
      result.stdout)
  assert f"train | finished at step {step + 20} " in result.stdout
  assert not os.path.exists(lease.lock_path(model_dir, lease.TRAINER))
