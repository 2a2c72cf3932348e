"""Keeping the best checkpoint (`best_checkpoint.*`), and its export, across
restarts."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import trainer
from trainer import actions
from trainer import experiment
from trainer.model import optimization
from trainer.storage import exports

import helpers
import ram_urls


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


# A digits run short enough for a test: one loop of 10 steps, evaluated and
# saved at its end, the best checkpoint kept (no exports: not what is
# checked).
_DIGITS_BEST = [
    "--gin_file=gin/digits.gin", "--gin_file=gin/features/best_checkpoint.gin",
    *(f"--gin_param=trainer.{name}=10" for name in (
        "train_steps", "steps_per_loop", "validation_interval",
        "checkpoint_interval", "summary_interval")),
    "--gin_param=export.best=False", "--gin_param=export.at_end=False"]


@pytest.mark.slow
def test_a_best_checkpoint_kept_before_any_step_is_the_restored_one_whole(
    tmp_path):
  """A resumed run that keeps a best checkpoint before its first step (here
  `best.json` deleted, the same `train_steps`: the final evaluation of step
  10 is the new best) keeps the checkpoint of that step whole. A restore
  fills the optimizer slots only at the first step, so a save of the state
  in memory had none: a resume or warm start from `best/` then started
  Adam from zero."""
  model_dir = tmp_path / "run"
  args = [*_DIGITS_BEST, f"--model_dir={model_dir}"]
  first = helpers.run_cli(args)
  assert first.returncode == 0, first.stderr[-2000:]
  os.remove(model_dir / "best" / "best.json")
  resumed = helpers.run_cli(args)
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert "restored checkpoint {}/ckpt-10 at step 10".format(model_dir) in (
      resumed.stdout.splitlines())
  assert [line for line in resumed.stdout.splitlines()
          if line.startswith("best | ")] == [
              "best | step 10: accuracy "
              f"{helpers.final_accuracy(resumed.stdout):.4f}"
              f", the best so far; kept in {model_dir}/best"]
  restored = tf.train.load_checkpoint(str(model_dir / "ckpt-10"))
  best = tf.train.load_checkpoint(str(model_dir / "best" / "ckpt-10"))
  keys = sorted(restored.get_variable_to_shape_map())
  assert sorted(best.get_variable_to_shape_map()) == keys
  # Adam's two slots of each of the CNN's 8 variables, and its step.
  assert len([key for key in keys if "/.OPTIMIZER_SLOT/" in key]) == 16
  assert "optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE" in keys
  # Every value but the input's position (a variant, which no reader
  # gives as an array).
  dtypes = restored.get_variable_to_dtype_map()
  compared = [key for key in keys if dtypes[key] != tf.variant]
  assert len(compared) == len(keys) - 1
  for key in compared:
    assert np.array_equal(best.get_tensor(key), restored.get_tensor(key)), key


def test_the_best_checkpoint_of_a_url_model_dir_is_kept_there(tmp_path,
                                                             monkeypatch):
  model_dir = ram_urls.model_dir(tmp_path, monkeypatch)
  weight, step = tf.Variable(0.0), _Step()
  checkpoint = tf.train.Checkpoint(model=weight)
  model = tf_keras.Sequential([tf_keras.Input((2,)), tf_keras.layers.Dense(1)])
  signatures = exports.default_signatures(model, tf.TensorSpec([None, 2]))
  best = actions.BestCheckpoint(
      model_dir, actions.BestCheckpointConfig(metric="loss",
                                              higher_is_better=False),
      step_fn=step, save_fn=checkpoint.write,
      export_fn=lambda directory: exports.export(model, signatures,
                                                 directory))
  # What a save killed there left.
  tf.io.gfile.makedirs(f"{model_dir}/best/ckpt-5_temp")
  with tf.io.gfile.GFile(f"{model_dir}/best/ckpt-5_temp/part-0", "w") as f:
    f.write("x")
  for step.step, loss in ((10, 0.5), (20, 0.3)):
    weight.assign(loss)
    best({"loss": loss})
  assert ram_urls.names(f"{model_dir}/best") == [
      "best.json", "ckpt-20.data-00000-of-00001", "ckpt-20.index",
      "export/20/.complete", "export/20/fingerprint.pb",
      "export/20/saved_model.pb",
      "export/20/variables/variables.data-00000-of-00001",
      "export/20/variables/variables.index"]
  assert not tf.io.gfile.exists(f"{model_dir}/best/ckpt-5_temp/part-0")
  restored = tf.Variable(0.0)
  tf.train.Checkpoint(model=restored).restore(f"{model_dir}/best/ckpt-20")
  assert float(restored.numpy()) == pytest.approx(0.3)
  assert actions.BestCheckpoint(
      model_dir, actions.BestCheckpointConfig(metric="loss",
                                              higher_is_better=False),
      step_fn=step, save_fn=checkpoint.write).record["step"] == 20
  tf.saved_model.load(f"{model_dir}/best/export/20")
  assert ram_urls.nothing_local(tmp_path)
