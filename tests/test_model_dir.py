"""Who writes where: the chief's leases by mode, a worker's own directory."""

import os

import pytest

import trainer
from trainer import actions
from trainer import model_dir
from trainer.distribute import cluster
from trainer.storage import lease


@pytest.mark.parametrize("mode, settings, roles", [
    ("train", {}, [lease.TRAINER]),
    ("train_and_eval", {}, [lease.TRAINER, lease.EVALUATOR]),
    ("continuous_eval", {}, [lease.EVALUATOR]),
    ("eval", {}, []),
    ("eval", {"best_checkpoint": actions.BestCheckpointConfig(
        metric="loss", higher_is_better=False)}, [lease.EVALUATOR]),
])
def test_lease_roles_by_mode(mode, settings, roles):
  assert model_dir.lease_roles(mode, trainer.TrainerConfig(**settings)) == (
      roles)


def test_the_chief_writes_into_model_dir_and_removes_its_leftovers(tmp_path):
  directory = tmp_path / "run"
  directory.mkdir()
  leftover = directory / ".tmp-operative_config.gin-x.part"
  leftover.write_text("half")
  with model_dir.write_directory(str(directory), cluster.WorkerInfo(),
                                 "train", trainer.TrainerConfig()) as where:
    assert where == str(directory)
    assert not leftover.exists()


def test_a_run_that_fails_before_writing_leaves_no_directory(tmp_path):
  directory = tmp_path / "runs" / "new"
  with pytest.raises(ValueError):
    with model_dir.write_directory(str(directory), cluster.WorkerInfo(),
                                   "train", trainer.TrainerConfig()):
      assert directory.is_dir()
      raise ValueError("a shape error at the first step")
  assert not (tmp_path / "runs").exists()  # Its parent, made for it, too.


def test_a_failed_run_keeps_what_is_written_and_what_it_did_not_make(
    tmp_path):
  (tmp_path / "runs").mkdir()
  (tmp_path / "runs" / "other").mkdir()
  written = tmp_path / "runs" / "new"
  with pytest.raises(ValueError):
    with model_dir.write_directory(str(written), cluster.WorkerInfo(),
                                   "train", trainer.TrainerConfig()):
      (written / "ckpt-1.index").write_text("saved")
      raise ValueError("failed later")
  assert (written / "ckpt-1.index").read_text() == "saved"
  empty = tmp_path / "runs" / "empty"
  empty.mkdir()  # There before the run: not its to remove.
  with pytest.raises(ValueError):
    with model_dir.write_directory(str(empty), cluster.WorkerInfo(),
                                   "train", trainer.TrainerConfig()):
      raise ValueError("failed")
  assert empty.is_dir() and (tmp_path / "runs" / "other").is_dir()


def test_a_worker_writes_into_a_directory_of_its_own(tmp_path):
  worker = cluster.WorkerInfo(num_workers=2, worker_index=1, is_chief=False)
  with model_dir.write_directory(str(tmp_path / "run"), worker, "train",
                                 trainer.TrainerConfig()) as where:
    assert os.path.basename(where).startswith("worker1-")
    assert os.path.isdir(where)
  assert not os.path.exists(where)
  assert not (tmp_path / "run").exists()
