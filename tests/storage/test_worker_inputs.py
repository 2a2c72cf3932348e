"""`worker_inputs`: each worker's input position of a step, beside the
chief's checkpoint of that step; never one of another step."""

import os

import tensorflow as tf

from trainer import console
from trainer.storage import checkpoints
from trainer.storage import worker_inputs


def _positions(model_dir, index=0, workers=2, barrier=None):
  dataset = tf.data.Dataset.range(10**6).shuffle(50, seed=index).batch(4)
  holder = {"iterator": iter(dataset)}
  positions = worker_inputs.WorkerInputs(
      str(model_dir), workers, index, lambda: holder["iterator"],
      barrier or (lambda: None))
  return positions, holder, dataset


def _next(holder, count=3):
  return [next(holder["iterator"]).numpy().tolist() for _ in range(count)]


def _chief_keeps(model_dir, steps):
  """Writes the chief's `checkpoint` state file, keeping `steps`."""
  tf.train.CheckpointManager(tf.train.Checkpoint(), str(model_dir), None)
  tf.compat.v1.train.update_checkpoint_state(
      str(model_dir), os.path.join(str(model_dir), f"ckpt-{steps[-1]}"),
      [os.path.join(str(model_dir), f"ckpt-{step}") for step in steps])


def test_a_restore_continues_where_the_worker_saved_each_step(tmp_path):
  met = []
  positions, holder, dataset = _positions(tmp_path, index=1,
                                          barrier=lambda: met.append(1))
  _next(holder, 5)
  prefix = positions.save(100)
  assert prefix == os.path.join(str(tmp_path), "input", "workers-2",
                                "worker-1", "ckpt-100")
  assert met == [1]  # The workers met after writing.
  after_100 = _next(holder)
  _chief_keeps(tmp_path, [100])  # The chief saved step 100.
  positions.save(200)
  after_200 = _next(holder)

  holder["iterator"] = iter(dataset)  # A rerun: a fresh iterator.
  line = positions.restore(100)
  assert line == (f"input | resuming: worker 1 continues from its position "
                  f"of step 100 ({prefix})")
  assert _next(holder) == after_100
  holder["iterator"] = iter(dataset)
  assert positions.restore(200) is not None
  assert _next(holder) == after_200
  assert worker_inputs.saved_steps(os.path.dirname(prefix)) == [100, 200]


def test_no_position_of_the_step_is_said_and_none_other_is_taken(
    tmp_path, monkeypatch):
  lines = []
  monkeypatch.setattr(console, "info", lines.append)
  positions, holder, _ = _positions(tmp_path)
  positions.save(100)
  # The save of step 200 was interrupted before this worker wrote.
  assert positions.restore(200) is None
  assert lines == [
      "input | worker 0 has no saved position of step 200 (a save "
      "interrupted before it was written): it skips the batches trained on "
      "instead"]


def test_another_worker_count_is_named(tmp_path, monkeypatch):
  lines = []
  monkeypatch.setattr(console, "info", lines.append)
  for index in range(4):
    _positions(tmp_path, index=index, workers=4)[0].save(300)
  positions, _, _ = _positions(tmp_path, index=1, workers=2)
  assert positions.restore(300) is None
  assert lines == [
      "input | step 300 was trained on 4 worker(s), this run has 2: the "
      "saved positions belong to the old shards, so each worker skips the "
      "batches of its new shard trained on (`skip`; the examples of the old "
      "shards are not matched: some of this epoch's may be read again or "
      "left out)"]


def test_positions_go_with_the_checkpoints_the_chief_no_longer_keeps(
    tmp_path):
  positions, holder, _ = _positions(tmp_path)
  folder = worker_inputs.directory(str(tmp_path), 2, 0)
  for step in (100, 200, 300):
    _chief_keeps(tmp_path, [s for s in (100, 200, 300) if s < step][-2:] or
                 [step])
    positions.save(step)
    next(holder["iterator"])
  # A killed write of an old step's leftovers go too.
  os.makedirs(os.path.join(folder, "ckpt-50_temp"))
  _chief_keeps(tmp_path, [200, 300])
  positions.save(400)
  assert worker_inputs.saved_steps(folder) == [200, 300, 400]
  assert not os.path.exists(os.path.join(folder, "ckpt-50_temp"))


def test_a_checkpoint_of_one_worker_is_named(tmp_path, monkeypatch):
  lines = []
  monkeypatch.setattr(console, "info", lines.append)
  iterator = iter(tf.data.Dataset.range(8))
  tf.train.Checkpoint(**{checkpoints.INPUT_POSITION: iterator}).write(
      str(tmp_path / "ckpt-40"))
  positions, _, _ = _positions(tmp_path, index=0, workers=2)
  assert positions.restore(40) is None
  assert lines[0].startswith(
      "input | step 40 was trained on 1 worker(s), this run has 2: ")
