"""Continuous evaluation: every checkpoint once, in order, across restarts,
with training holding checkpoints until they are evaluated."""

import json
import os

import pytest

import tensorflow as tf

import trainer
from trainer import errors
from trainer import experiment
from trainer.loop.control import continuous_eval
from trainer.storage import checkpoints
from trainer.storage import evaluated

import helpers
import ram_urls


def _write_checkpoints(model_dir, steps):
  step = tf.Variable(0, dtype=tf.int64)
  manager = tf.train.CheckpointManager(tf.train.Checkpoint(step=step),
                                       str(model_dir), max_to_keep=None)
  for value in steps:
    step.assign(value)
    manager.save(checkpoint_number=value)


class _Evaluator:
  """Records which checkpoints it evaluated; fails on deleted ones."""

  def __init__(self):
    self.evaluated = []

  def __call__(self, prefix):
    if not os.path.exists(prefix + ".index"):
      raise errors.ConfigError(f"no checkpoint in {prefix} can be restored")
    step = checkpoints.number(prefix)
    self.evaluated.append(step)
    return step, {"loss": 1.0 / step}


class _FakeTime:

  def __init__(self):
    self.now = 0.0

  def clock(self):
    return self.now

  def sleep(self, seconds):
    self.now += seconds


def test_each_checkpoint_once_in_order_and_a_restart_skips_them(tmp_path):
  _write_checkpoints(tmp_path, [10, 20, 30, 40, 50])
  first = _Evaluator()
  output = continuous_eval.run(str(tmp_path), first, train_steps=30,
                               timeout=5)
  assert first.evaluated == [10, 20, 30]
  assert output == {"loss": 1.0 / 30}
  second = _Evaluator()
  continuous_eval.run(str(tmp_path), second, train_steps=50, timeout=5)
  assert second.evaluated == [40, 50]
  with open(tmp_path / "eval" / "evaluated.json") as f:
    record = json.load(f)
  assert record["steps"] == [10, 20, 30, 40, 50]
  assert record["results"]["40"] == {"loss": 1.0 / 40}
  assert evaluated.steps(str(tmp_path)) == {10, 20, 30, 40, 50}


def test_waits_for_new_checkpoints_until_the_timeout(tmp_path):
  _write_checkpoints(tmp_path, [10])
  time = _FakeTime()
  evaluator = _Evaluator()
  with pytest.raises(errors.RunError) as raised:
    continuous_eval.run(str(tmp_path), evaluator, train_steps=100,
                        timeout=30, clock=time.clock, sleep=time.sleep)
  assert evaluator.evaluated == [10]
  assert 30 < time.now <= 32
  # Not a success: the run it follows never reached its final step.
  assert str(raised.value) == (
      f"continuous_eval: no new checkpoint in {tmp_path} for 30 s "
      "(`trainer.continuous_eval_timeout`); the last evaluated step is 10, "
      "not `trainer.train_steps` (100): is the trainer running?")


def test_a_checkpoint_deleted_before_its_turn_is_reported(tmp_path, capsys):
  _write_checkpoints(tmp_path, [10, 20])
  os.remove(tmp_path / "ckpt-10.index")
  evaluator = _Evaluator()
  continuous_eval.run(str(tmp_path), evaluator, train_steps=20, timeout=5)
  assert evaluator.evaluated == [20]
  assert (f"continuous_eval | missed {tmp_path}/ckpt-10: deleted before it "
          "was evaluated (set trainer.keep_until_evaluated=True in the "
          "training run)") in capsys.readouterr().out


def _config(train_steps, **settings):
  return trainer.TrainerConfig(
      train_steps=train_steps, steps_per_loop=10, summary_interval=10,
      checkpoint_interval=10, global_batch_size=32, max_to_keep=1,
      **settings)


def test_training_holds_checkpoints_until_they_are_evaluated(tmp_path):
  model_dir = str(tmp_path)
  runtime = trainer.RuntimeConfig(seed=0)
  task = helpers.LinearRegression()
  experiment.run(task, "train", model_dir, runtime,
                 _config(50, keep_until_evaluated=True))
  # No evaluator yet: nothing beyond `max_to_keep` (1) was deleted.
  assert [s for s, _ in continuous_eval.pending(model_dir, set())] == [
      10, 20, 30, 40, 50]
  experiment.run(task, "continuous_eval", model_dir, runtime,
                 _config(50, continuous_eval_timeout=5,
                         keep_until_evaluated=True))
  assert [s for s, _ in helpers.read_scalars(
      os.path.join(model_dir, "eval"))["loss"]] == [10, 20, 30, 40, 50]
  # Training has ended: the evaluator trims to `max_to_keep` once done.
  assert [s for s, _ in continuous_eval.pending(model_dir, set())] == [50]
  assert sorted(p for p in os.listdir(model_dir) if p.endswith(".index")) == [
      "ckpt-50.index"]
  # The next save deletes the evaluated ones beyond `max_to_keep`.
  experiment.run(task, "train", model_dir, runtime,
                 _config(60, keep_until_evaluated=True))
  assert [s for s, _ in continuous_eval.pending(model_dir, set())] == [60]
  assert sorted(p for p in os.listdir(model_dir) if p.endswith(".index")) == [
      "ckpt-60.index"]


def test_a_slower_evaluator_process_beside_training_misses_nothing(tmp_path):
  common = ["--gin_file=gin/digits.gin", f"--model_dir={tmp_path}",
            "--gin_param=trainer.train_steps=100",
            "--gin_param=trainer.steps_per_loop=10",
            "--gin_param=trainer.summary_interval=10",
            "--gin_param=trainer.checkpoint_interval=10",
            "--gin_param=trainer.validation_interval=0",
            "--gin_param=trainer.max_to_keep=1",
            "--gin_param=trainer.keep_until_evaluated=True",
            "--gin_param=trainer.continuous_eval_timeout=60",
            "--gin_param=best_checkpoint.metric='accuracy'",
            "--gin_param=best_checkpoint.higher_is_better=True"]
  evaluator = helpers.TrainProcess(common + ["--mode=continuous_eval"])
  training = helpers.TrainProcess(common + ["--mode=train"])
  try:
    assert training.finish(timeout=240) == 0, training.stderr[-2000:]
    assert evaluator.finish(timeout=240) == 0, evaluator.stderr[-2000:]
  finally:
    training.close()
    evaluator.close()
  evals = helpers.read_scalars(str(tmp_path / "eval"))["accuracy"]
  # Ten checkpoints, each evaluated exactly once, in order.
  assert [step for step, _ in evals] == list(range(10, 101, 10))
  with open(tmp_path / "best" / "best.json") as f:
    record = json.load(f)
  best_step, best = max(evals, key=lambda item: (item[1], -item[0]))
  assert (record["step"], record["value"]) == (best_step, best)
  # The evaluator copied the checkpoint it evaluated: the whole state.
  copied = helpers.checkpoint_numbers(str(tmp_path / "best" /
                                          record["checkpoint"]))
  assert copied["global_step/.ATTRIBUTES/VARIABLE_VALUE"] == best_step
  assert any(".OPTIMIZER_SLOT/optimizer/m/" in name for name in copied)


def test_the_checkpoints_of_a_url_model_dir_are_evaluated_once_there(
    tmp_path, monkeypatch, capsys):
  model_dir = ram_urls.model_dir(tmp_path, monkeypatch)
  _write_checkpoints(model_dir, [10, 20, 30])
  for path in tf.io.gfile.glob(f"{model_dir}/ckpt-20.*"):
    tf.io.gfile.remove(path)  # Deleted before its turn.

  def evaluate(prefix):  # ckpt-10 is there but damaged.
    if checkpoints.number(prefix) == 10 or not tf.io.gfile.exists(
        prefix + ".index"):
      raise errors.ConfigError(f"no checkpoint in {prefix} can be restored")
    return checkpoints.number(prefix), {"loss": 1.0}

  continuous_eval.run(model_dir, evaluate, train_steps=30, timeout=5)
  out = capsys.readouterr().out
  assert (f"continuous_eval | skipped {model_dir}/ckpt-10: it cannot be "
          "restored") in out
  assert (f"continuous_eval | missed {model_dir}/ckpt-20: deleted before it "
          "was evaluated") in out
  assert evaluated.steps(model_dir) == {30}
  assert evaluated.RECORD in ram_urls.names(model_dir)
  assert ram_urls.nothing_local(tmp_path)
