"""Actions between loops: the best checkpoint (kept, recorded, remembered
across restarts) and early stopping (patience, persistence, resume)."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

import trainer
from trainer import actions
from trainer import experiment
from trainer.loop import continuous_eval
from trainer.model import optimization
from trainer.storage import exports

import helpers


class _Recorder:
  """Stands in for checkpoint and export writers; records what they got."""

  def __init__(self):
    self.saved, self.exported = [], []

  def save(self, prefix):
    self.saved.append(prefix)
    for suffix in (".index", ".data-00000-of-00001"):
      with open(prefix + suffix, "w") as f:
        f.write(prefix)

  def export(self, directory):
    self.exported.append(directory)
    os.makedirs(directory)


class _Step:
  """The global step an action reads; the test moves it."""

  def __init__(self, step=0):
    self.step = step

  def __call__(self):
    return self.step


def _best(model_dir, step, recorder, **config):
  config = actions.BestCheckpointConfig(**config)
  return actions.BestCheckpoint(str(model_dir), config, step_fn=step,
                                save_fn=recorder.save,
                                export_fn=recorder.export)


def test_best_checkpoint_keeps_only_the_best_and_records_it(tmp_path):
  recorder, step = _Recorder(), _Step()
  best = _best(tmp_path, step, recorder, metric="accuracy",
               higher_is_better=True)
  for step.step, accuracy in ((10, 0.5), (20, 0.8), (30, 0.7)):
    best({"accuracy": np.float32(accuracy), "loss": 1.0})
  directory = tmp_path / "best"
  assert recorder.saved == [f"{directory}/ckpt-10", f"{directory}/ckpt-20"]
  assert sorted(os.listdir(directory)) == [
      "best.json", "ckpt-20.data-00000-of-00001", "ckpt-20.index", "export"]
  assert os.listdir(directory / "export") == ["20"]
  with open(directory / "best.json") as f:
    assert json.load(f) == {
        "step": 20, "metric": "accuracy", "value": pytest.approx(0.8),
        "higher_is_better": True, "checkpoint": "ckpt-20",
        "export": "export/20"}


def test_best_checkpoint_survives_a_restart(tmp_path):
  _best(tmp_path, _Step(10), _Recorder(), metric="loss",
        higher_is_better=False)({"loss": 0.3})
  recorder, step = _Recorder(), _Step(20)
  restarted = _best(tmp_path, step, recorder, metric="loss",
                    higher_is_better=False)
  restarted({"loss": 0.4})  # Worse than the 0.3 of before the restart.
  assert not recorder.saved
  step.step = 30
  restarted({"loss": 0.2})
  assert recorder.saved == [f"{tmp_path}/best/ckpt-30"]
  assert restarted.record["step"] == 30


def test_best_checkpoint_needs_a_direction_and_a_known_metric(tmp_path):
  with pytest.raises(trainer.ConfigError, match="^`best_checkpoint.higher_is_"
                     "better` must be True or False for metric 'accuracy'."):
    actions.BestCheckpointConfig(metric="accuracy")
  best = _best(tmp_path, _Step(10), _Recorder(), metric="acc",
               higher_is_better=True)
  with pytest.raises(trainer.ConfigError, match=r"^`best_checkpoint.metric` "
                     r"\('acc'\) is not an eval result; the results are: "
                     r"accuracy, loss\.$"):
    best({"accuracy": 0.5, "loss": 1.0})


def test_training_keeps_the_best_checkpoint_and_its_export(tmp_path):
  task = helpers.ConfiguredRegression()
  config = trainer.TrainerConfig(
      train_steps=40, steps_per_loop=10, summary_interval=10,
      checkpoint_interval=40, validation_interval=10, global_batch_size=32,
      optimizer=optimization.OptimizerConfig(name="sgd", learning_rate=0.1),
      best_checkpoint=actions.BestCheckpointConfig(metric="loss",
                                                   higher_is_better=False),
      export=exports.ExportConfig(best=True))
  experiment.run(task, "train_and_eval", str(tmp_path),
                 trainer.RuntimeConfig(seed=0), config)
  evals = helpers.read_scalars(str(tmp_path / "eval"))["loss"]
  best_step, best_loss = min(evals, key=lambda item: item[1])
  with open(tmp_path / "best" / "best.json") as f:
    record = json.load(f)
  assert (record["step"], record["value"]) == (best_step,
                                               pytest.approx(best_loss))
  # The best checkpoint is a whole training state at that step.
  prefix = str(tmp_path / "best" / record["checkpoint"])
  assert helpers.checkpoint_step(prefix) == best_step
  assert "optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE" in (
      helpers.checkpoint_numbers(prefix))
  assert os.listdir(tmp_path / "best" / "export") == [str(best_step)]
  serve = tf.saved_model.load(str(tmp_path / "best" / record["export"]))
  features, labels = next(iter(task.build_inputs(False).batch(256)))
  outputs = serve.signatures["serving_default"](features=features)["outputs"]
  served_loss = float(tf.reduce_mean(task.build_losses(labels, outputs)))
  assert served_loss == pytest.approx(best_loss, rel=1e-5)


def _early(model_dir, step, patience=2, min_delta=0.0):
  return actions.EarlyStopping(
      str(model_dir), actions.EarlyStoppingConfig(
          metric="loss", higher_is_better=False, patience=patience,
          min_delta=min_delta), step_fn=step)


def test_early_stopping_counts_evaluations_without_improvement(tmp_path):
  step = _Step()
  early = _early(tmp_path, step, min_delta=0.01)
  for step.step, loss in ((10, 1.0), (20, 0.995), (30, 0.5), (40, 0.6)):
    early({"loss": loss})  # 0.995 is better by less than min_delta.
    assert early.stop_reason() is None
  # Restarted with the state on disk: one more without improvement stops.
  restarted = _early(tmp_path, _Step(50), min_delta=0.01)
  restarted({"loss": 0.55})
  assert restarted.stop_reason() == (
      "loss has not improved on 0.5000 (step 30) for 2 evaluations "
      "(patience 2)")
  # A larger patience lets the same run go on.
  assert _early(tmp_path, _Step(50), patience=3).stop_reason() is None


def test_early_stopping_decides_on_the_set_of_evaluated_steps(tmp_path):
  losses = {100: 1.0, 200: 0.9, 300: 0.95, 400: 0.96}

  def evaluate(early, step, steps, loss=None):
    for step.step in steps:
      early({"loss": losses[step.step] if loss is None else loss})

  step = _Step()
  uninterrupted = _early(tmp_path / "a", step, patience=3)
  evaluate(uninterrupted, step, losses)
  # Killed after evaluating 300 and restarted from the checkpoint at 200:
  # 300 is evaluated again (counted once), then 400.
  evaluate(_early(tmp_path / "b", step, patience=3), step, (100, 200, 300))
  resumed = _early(tmp_path / "b", step, patience=3)
  evaluate(resumed, step, (300, 400))
  assert resumed.state == uninterrupted.state == {
      "best": 0.9, "best_step": 200, "evaluations_since_best": 2}
  # Restarted from 200 on a timeline whose 300 and 400 were lost: evaluating
  # 300 again drops the evaluation of 400.
  evaluate(resumed, step, (300,), loss=0.5)
  assert sorted(resumed.values) == [100, 200, 300]
  assert resumed.state == {"best": 0.5, "best_step": 300,
                           "evaluations_since_best": 0}


def test_training_stops_early_and_stays_stopped(tmp_path, capsys):
  # A learning rate of (almost) zero: the eval loss never improves.
  config = trainer.TrainerConfig(
      train_steps=200, steps_per_loop=10, summary_interval=10,
      checkpoint_interval=100, validation_interval=10, global_batch_size=32,
      optimizer=optimization.OptimizerConfig(name="sgd", learning_rate=1e-12),
      early_stopping=actions.EarlyStoppingConfig(
          metric="loss", higher_is_better=False, patience=3, min_delta=1e-3))
  experiment.run(helpers.ConfiguredRegression(), "train_and_eval",
                 str(tmp_path), trainer.RuntimeConfig(seed=0), config)
  out = capsys.readouterr().out
  assert "train | stopping early at step 40: loss has not improved on " in out
  # Evaluations at 10 (the best), 20, 30, 40; saved where it stopped.
  assert [s for s, _ in helpers.read_scalars(
      str(tmp_path / "eval"))["loss"]] == [10, 20, 30, 40]
  assert helpers.checkpoint_step(str(tmp_path)) == 40
  # Run again: it stays stopped (one evaluation, no training).
  experiment.run(helpers.ConfiguredRegression(), "train_and_eval",
                 str(tmp_path), trainer.RuntimeConfig(seed=0), config)
  assert "train | stopping early at step 40" in capsys.readouterr().out
  assert helpers.checkpoint_step(str(tmp_path)) == 40


def test_eval_images_writer_writes_the_last_evaluations_images(tmp_path):
  images, step = {}, _Step(30)
  writer = actions.EvalImagesWriter(str(tmp_path / "eval"), lambda: images,
                                    step_fn=step)
  writer({"loss": 1.0})  # No images: nothing written.
  assert not (tmp_path / "eval").exists()
  images["samples/digit"] = np.full((4, 3, 1), 0.5, np.float32)
  writer({"loss": 1.0})
  png = tmp_path / "eval" / "images" / "samples_digit-30.png"
  decoded = tf.io.decode_png(png.read_bytes()).numpy()
  assert decoded.shape == (4, 3, 1) and (decoded == 128).all()
  assert helpers.read_tags(str(tmp_path / "eval")) == {"samples/digit"}


def test_evaluated_step_recorder_keeps_every_step_across_restarts(tmp_path):
  step = _Step(10)
  actions.EvaluatedStepRecorder(str(tmp_path), step_fn=step)(
      {"mae": np.float32(0.5)})
  step.step = 20
  # A restarted run's recorder adds to what the first one recorded.
  actions.EvaluatedStepRecorder(str(tmp_path), step_fn=step)({"mae": 0.25})
  assert continuous_eval.read_evaluated(str(tmp_path)) == {10, 20}
  with open(tmp_path / continuous_eval.RECORD) as f:
    assert json.load(f) == {"steps": [10, 20],
                            "results": {"10": {"mae": 0.5},
                                        "20": {"mae": 0.25}}}
