"""End-to-end runs of `experiment.run` in-process: checkpoints, resume,
summaries and every mode, read back from real files."""

import json
import os
import shutil

import gin
import numpy as np
import pytest
import tensorflow as tf

import trainer
from trainer import experiment
from trainer.loop.control import controller as controller_lib
from trainer.model import optimization

import helpers


def _config(**overrides):
  settings = dict(train_steps=20, steps_per_loop=10, summary_interval=10,
                  global_batch_size=32, eval_batch_size=64,
                  checkpoint_interval=10)
  settings.update(overrides)
  return trainer.TrainerConfig(**settings)


def _runtime(strategy="one_device"):
  return trainer.RuntimeConfig(
      distribution_strategy=strategy, seed=3,
      num_cpu_devices=2 if strategy == "mirrored" else 0)


def _checkpoint_steps(model_dir):
  state = tf.train.get_checkpoint_state(model_dir)
  return [int(p.rsplit("-", 1)[1]) for p in state.all_model_checkpoint_paths]


@pytest.mark.parametrize("first,second", [("one_device", "one_device"),
                                          ("mirrored", "one_device")])
def test_resume_continues_exactly(tmp_path, first, second):
  task = helpers.LinearRegression()
  straight = str(tmp_path / "straight")
  experiment.run(task, "train", straight, _runtime(), _config(train_steps=40))

  resumed = str(tmp_path / "resumed")
  experiment.run(task, "train", resumed, _runtime(first),
                 _config(train_steps=20))
  halfway = helpers.checkpoint_weights(resumed)
  experiment.run(task, "train", resumed, _runtime(second),
                 _config(train_steps=40))

  assert helpers.checkpoint_step(resumed) == 40
  assert _checkpoint_steps(resumed)[-1] == 40
  final = helpers.checkpoint_weights(resumed)
  assert helpers.max_weight_difference(halfway, final) > 1e-3  # It trained.
  # 20 + 20 steps (model, optimizer, step and input position restored) match
  # 40 straight steps.
  assert helpers.max_weight_difference(
      final, helpers.checkpoint_weights(straight)) < 1e-5


class _GeneratorLinearRegression(helpers.LinearRegression):
  """Input from a Python generator: its iterator cannot be checkpointed.

  Reshuffled every epoch with a fixed seed, as the shipped tasks are.
  """

  def build_inputs(self, training, input_context=None):
    examples = super().build_inputs(training, input_context)
    return tf.data.Dataset.from_generator(
        examples.as_numpy_iterator, output_signature=examples.element_spec
    ).shuffle(self.num_examples, seed=1, reshuffle_each_iteration=True)


def test_resume_skips_the_consumed_input_when_it_cannot_be_saved(
    tmp_path, capfd):
  task = _GeneratorLinearRegression()
  straight = str(tmp_path / "straight")
  experiment.run(task, "train", straight, _runtime(), _config(train_steps=30))
  resumed = str(tmp_path / "resumed")
  experiment.run(task, "train", resumed, _runtime(), _config(train_steps=10))
  experiment.run(task, "train", resumed, _runtime(), _config(train_steps=30))
  assert "skips the 10 batch(es) trained on before" in capfd.readouterr().out
  # 10 steps then 20 more (8 batches per epoch: the restart is mid-epoch)
  # equal 30 straight steps, bit for bit.
  assert helpers.max_weight_difference(
      helpers.checkpoint_weights(resumed),
      helpers.checkpoint_weights(straight)) == 0.0


class _NoisyInputs(helpers.LinearRegression):
  """Adds noise from a `tf.random.Generator` kept on the model, so its state
  is part of the checkpoint."""

  def build_model(self):
    model = super().build_model()
    model.noise = tf.random.Generator.from_seed(5)
    return model

  def train_step(self, inputs, model, optimizer, metrics=None):
    features, labels = inputs
    features += 0.1 * model.noise.normal(tf.shape(features))
    return super().train_step((features, labels), model, optimizer, metrics)


def test_random_generator_state_resumes_exactly(tmp_path):
  straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
  experiment.run(_NoisyInputs(), "train", straight, _runtime(),
                 _config(train_steps=40))
  experiment.run(_NoisyInputs(), "train", resumed, _runtime(),
                 _config(train_steps=20))
  experiment.run(_NoisyInputs(), "train", resumed, _runtime(),
                 _config(train_steps=40))
  ours = helpers.checkpoint_weights(resumed)
  assert "model/noise/_state_var/.ATTRIBUTES/VARIABLE_VALUE" in ours
  assert helpers.max_weight_difference(
      ours, helpers.checkpoint_weights(straight)) == 0.0


def test_finished_run_does_not_train_again(tmp_path):
  model_dir = str(tmp_path)
  task = helpers.LinearRegression()
  experiment.run(task, "train", model_dir, _runtime(), _config())
  before = helpers.checkpoint_weights(model_dir)
  experiment.run(task, "train", model_dir, _runtime(), _config())
  assert helpers.checkpoint_step(model_dir) == 20
  assert helpers.max_weight_difference(
      before, helpers.checkpoint_weights(model_dir)) == 0.0


def test_saves_at_the_end_when_interval_does_not_divide(tmp_path):
  model_dir = str(tmp_path)
  experiment.run(helpers.LinearRegression(), "train", model_dir, _runtime(),
                 _config(train_steps=50, checkpoint_interval=20,
                         max_to_keep=10))
  assert _checkpoint_steps(model_dir) == [20, 40, 50]


def test_max_to_keep_deletes_older_checkpoints(tmp_path):
  model_dir = str(tmp_path)
  experiment.run(helpers.LinearRegression(), "train", model_dir, _runtime(),
                 _config(train_steps=50, max_to_keep=2))
  assert _checkpoint_steps(model_dir) == [40, 50]
  assert not tf.io.gfile.glob(os.path.join(model_dir, "ckpt-10*"))


def test_train_and_eval_writes_summaries_and_operative_config(tmp_path):
  model_dir = str(tmp_path)
  gin.parse_config(["trainer.train_steps = 40", "trainer.summary_interval = 20",
                    "trainer.validation_interval = 20"])
  # Gin fills what is not passed here.
  config = trainer.TrainerConfig(steps_per_loop=10, global_batch_size=32,
                                 eval_batch_size=64, checkpoint_interval=10)
  output = experiment.run(helpers.LinearRegression(), "train_and_eval",
                          model_dir, _runtime(), config)

  train = helpers.read_scalars(os.path.join(model_dir, "train"))
  for tag in ("loss", "mae", "gradient_norm", "learning_rate",
              "steps_per_second", "examples_per_second"):
    assert [step for step, _ in train[tag]] == [20, 40], tag
  assert train["learning_rate"][0][1] == pytest.approx(0.1)
  for (_, sps), (_, eps) in zip(train["steps_per_second"],
                                train["examples_per_second"]):
    assert eps == pytest.approx(32 * sps, rel=1e-4)
  assert "operative_config" in helpers.read_tags(
      os.path.join(model_dir, "train"))

  evals = helpers.read_scalars(os.path.join(model_dir, "eval"))
  assert [step for step, _ in evals["loss"]] == [20, 40]
  assert [step for step, _ in evals["mae"]] == [20, 40]
  assert evals["loss"][-1][1] == pytest.approx(float(output["loss"]))

  with open(os.path.join(model_dir, "operative_config.gin")) as f:
    text = f.read()
  assert "trainer.train_steps = 40" in text
  assert "trainer.validation_interval = 20" in text


def test_full_eval_pass_counts_the_partial_last_batch_once(tmp_path):
  # 100 eval examples, eval batch 64 over 2 replicas: batches of 64 and 36.
  task = helpers.LinearRegression(num_examples=100)
  model_dir = str(tmp_path)
  experiment.run(task, "train", model_dir, _runtime("mirrored"),
                 _config(train_steps=10))
  output = experiment.run(task, "eval", model_dir, _runtime("mirrored"),
                          _config(train_steps=10))

  model = task.build_model()
  tf.train.Checkpoint(model=model).restore(
      tf.train.latest_checkpoint(model_dir)).expect_partial()
  features, labels = next(iter(task.build_inputs(False).batch(1000)))
  errors = (labels - model(features)).numpy()[:, 0]
  assert float(output["loss"]) == pytest.approx(np.mean(errors ** 2),
                                                rel=1e-5)
  assert float(output["mae"]) == pytest.approx(np.mean(np.abs(errors)),
                                               rel=1e-5)


def test_validation_steps_limits_the_eval(tmp_path):
  task = helpers.LinearRegression(num_examples=256)
  model_dir = str(tmp_path)
  experiment.run(task, "train", model_dir, _runtime(), _config())
  partial = experiment.run(task, "eval", model_dir, _runtime(),
                           _config(validation_steps=1))
  full = experiment.run(task, "eval", model_dir, _runtime(), _config())
  assert float(partial["loss"]) != pytest.approx(float(full["loss"]))


def test_eval_without_checkpoint_is_a_config_error(tmp_path):
  with pytest.raises(trainer.ConfigError, match="no checkpoint to evaluate"):
    experiment.run(helpers.LinearRegression(), "eval", str(tmp_path / "x"),
                   _runtime(), _config())
  assert not os.path.exists(tmp_path / "x")


def test_continuous_eval_evaluates_checkpoints_until_the_last_step(tmp_path):
  model_dir = str(tmp_path)
  task = helpers.LinearRegression()
  experiment.run(task, "train", model_dir, _runtime(), _config())
  output = experiment.run(task, "continuous_eval", model_dir, _runtime(),
                          _config(continuous_eval_timeout=5))
  evals = helpers.read_scalars(os.path.join(model_dir, "eval"))
  assert evals["loss"][-1][0] == 20
  assert evals["loss"][-1][1] == pytest.approx(float(output["loss"]))


def test_batch_not_divisible_by_replicas_is_a_config_error(tmp_path):
  with pytest.raises(trainer.ConfigError, match="divisible by the number of "
                     r"replicas \(2\)"):
    experiment.run(helpers.LinearRegression(), "train", str(tmp_path),
                   _runtime("mirrored"), _config(global_batch_size=33))


def test_a_saved_but_unevaluated_validation_step_is_evaluated_first(tmp_path,
                                                                   capsys):
  config = _config(train_steps=40, validation_interval=20,
                   checkpoint_interval=20)
  # What a stop between saving step 20 and evaluating it leaves.
  experiment.run(helpers.LinearRegression(), "train", str(tmp_path),
                 _runtime(), _config(train_steps=20, checkpoint_interval=20))
  experiment.run(helpers.LinearRegression(), "train_and_eval", str(tmp_path),
                 _runtime(), config)
  assert ("eval | step 20 was saved but not evaluated: evaluating it first"
          in capsys.readouterr().out)
  assert [s for s, _ in helpers.read_scalars(
      str(tmp_path / "eval"))["loss"]] == [20, 40]
  with open(tmp_path / "eval" / "evaluated.json") as f:
    assert json.load(f)["steps"] == [20, 40]
  # Nothing is missed now: a rerun to 60 evaluates 60 only, not 40 again.
  experiment.run(helpers.LinearRegression(), "train_and_eval", str(tmp_path),
                 _runtime(), _config(train_steps=60, validation_interval=20,
                                     checkpoint_interval=20))
  assert "evaluating it first" not in capsys.readouterr().out
  assert [s for s, _ in helpers.read_scalars(
      str(tmp_path / "eval"))["loss"]] == [20, 40, 60]


def test_an_eval_set_empty_at_run_time_is_an_error(tmp_path):
  class FilteredOut(helpers.LinearRegression):

    def build_inputs(self, training, input_context=None):
      dataset = super().build_inputs(training, input_context)
      return dataset if training else dataset.filter(lambda x, y: False)

  with pytest.raises(trainer.ConfigError,
                     match="^the evaluation dataset yielded no example"):
    experiment.run(FilteredOut(), "train_and_eval", str(tmp_path), _runtime(),
                   _config())
  # The trained steps were saved before the evaluation.
  assert helpers.checkpoint_step(str(tmp_path)) == 20


@pytest.mark.parametrize("filtered", [False, True])
def test_more_validation_steps_than_eval_batches_is_an_error(tmp_path,
                                                             filtered):
  class Evaluated(helpers.LinearRegression):

    def build_inputs(self, training, input_context=None):
      dataset = super().build_inputs(training, input_context)
      # A filter hides the size until the data is read.
      return dataset.filter(lambda x, y: True) if filtered else dataset

  with pytest.raises(trainer.ConfigError) as raised:
    experiment.run(Evaluated(), "train_and_eval", str(tmp_path), _runtime(),
                   _config(validation_steps=10))
  # 256 eval examples in batches of 64.
  assert str(raised.value) == (
      "`trainer.validation_steps` (10) is more than the 4 batch(es) of the "
      "evaluation dataset; use -1 for one full pass.")


def test_train_steps_below_the_checkpoint_say_so(tmp_path, capsys):
  experiment.run(helpers.LinearRegression(), "train", str(tmp_path),
                 _runtime(), _config())
  capsys.readouterr()
  experiment.run(helpers.LinearRegression(), "train_and_eval", str(tmp_path),
                 _runtime(), _config(train_steps=10))
  assert capsys.readouterr().out.count(
      "warning | the checkpoint is at step 20, past `trainer.train_steps` "
      "(10): nothing to train; raise it to train more") == 1


def test_a_model_dir_deleted_during_the_run_stops_the_next_save(tmp_path):
  """Deleted once, during the first loop, before any summary, evaluation
  or save: the writers first used after it (train and eval summaries,
  `metrics.csv`, the operative config) make nothing again."""
  model_dir = tmp_path / "run"
  deleted = []

  class DeletesModelDir(helpers.LinearRegression):

    def build_inputs(self, training, input_context=None):
      def delete_at(index, x, y):
        # While batch 5 is read (the input repeats: once).
        if training and index == 32 * 5 and not deleted:
          deleted.append(index)
          shutil.rmtree(model_dir, ignore_errors=True)
        return x, y

      return super().build_inputs(training, input_context).enumerate().map(
          lambda i, example: tf.numpy_function(
              delete_at, [i, *example], [tf.float32, tf.float32])).map(
                  lambda x, y: (tf.ensure_shape(x, [4]),
                                tf.ensure_shape(y, [1])))

  with pytest.raises(trainer.RunError) as raised:
    experiment.run(DeletesModelDir(), "train_and_eval", str(model_dir),
                   _runtime(), _config(train_steps=40, checkpoint_interval=40,
                                       validation_interval=20))
  assert str(raised.value) == (
      f"model_dir {model_dir} was deleted or replaced during the run; the "
      "checkpoint of step 40 is not saved.")
  assert deleted and not model_dir.exists()


def test_a_model_dir_deleted_while_the_checkpoint_is_restored_stops_the_first_save(
    tmp_path, monkeypatch):
  """Deleted after the run took it (made, leased) and before the
  controller was built: the first save sees it as one deleted later."""
  model_dir = tmp_path / "run"
  restore = controller_lib.Controller.restore_checkpoint

  def deleting_restore(self, *args, **kwargs):
    shutil.rmtree(model_dir)
    return restore(self, *args, **kwargs)

  monkeypatch.setattr(controller_lib.Controller, "restore_checkpoint",
                      deleting_restore)
  with pytest.raises(trainer.RunError) as raised:
    experiment.run(helpers.LinearRegression(), "train_and_eval",
                   str(model_dir), _runtime(), _config(validation_interval=10))
  assert str(raised.value) == (
      f"model_dir {model_dir} was deleted or replaced during the run; the "
      "checkpoint of step 10 is not saved.")
  assert not model_dir.exists()


def _sgd(rate, **settings):
  return _config(optimizer=optimization.OptimizerConfig(name="sgd",
                                                   learning_rate=rate),
                 **settings)


@pytest.mark.parametrize("resumed_with", [
    dict(optimizer=optimization.OptimizerConfig(name="sgd", learning_rate=1e-12)),
    # A schedule takes the restored step: its new rates hold at once.
    dict(learning_rate=optimization.ScheduleConfig(
        schedule="stepwise", boundaries=(10,), values=(0.1, 1e-12))),
    # Clipping is an option of the train step, built anew.
    dict(gradient_clip_value=1e-12),
])
def test_a_resume_trains_with_the_settings_it_is_given(tmp_path,
                                                       resumed_with):
  model_dir = str(tmp_path)
  task = helpers.ConfiguredRegression()
  experiment.run(task, "train", model_dir, _runtime(), _sgd(0.1))
  halfway = helpers.checkpoint_weights(model_dir)
  settings = dict(train_steps=40, optimizer=optimization.OptimizerConfig(
      name="sgd", learning_rate=0.1))
  settings.update(resumed_with)
  experiment.run(task, "train", model_dir, _runtime(), _config(**settings))
  assert helpers.checkpoint_step(model_dir) == 40
  # At the old rate of 0.1 the same 20 steps move a weight by about 0.3.
  assert helpers.max_weight_difference(
      halfway, helpers.checkpoint_weights(model_dir)) < 1e-9


def test_a_resume_at_a_huge_rate_meets_the_nonfinite_guard(tmp_path):
  model_dir = str(tmp_path)
  task = helpers.ConfiguredRegression()
  experiment.run(task, "train", model_dir, _runtime(), _sgd(0.1))
  with pytest.raises(trainer.NonFiniteError) as raised:
    experiment.run(task, "train", model_dir, _runtime(),
                   _sgd(1e6, train_steps=40))
  assert 20 < raised.value.step < 40  # Resumed at 20; trains to 40.


# Named evaluation sets.


class _RegressionSets(helpers.LinearRegression):
  """The regression evaluated on sets made from its eval split by name."""

  def __init__(self, sets):
    super().__init__()
    self.sets = sets  # name -> (eval dataset -> the set's dataset)

  def build_inputs(self, training, input_context=None):
    dataset = super().build_inputs(training, input_context)
    if training:
      return dataset
    return {name: make(dataset) for name, make in self.sets.items()}


_TWO_SETS = {"clean": lambda ds: ds, "noisy": lambda ds: ds.take(100)}


def _best(metric):
  return trainer.actions.BestCheckpointConfig(metric=metric,
                                              higher_is_better=False)


@pytest.mark.parametrize("sets,overrides,message", [
    ({"clean": lambda ds: ds, "empty": lambda ds: ds.take(0)}, {},
     "the evaluation set 'empty' is empty."),
    ({}, {},
     "`build_inputs(training=False)` returned no evaluation set (an empty "
     "dict): return a dataset, or a dict of datasets by name."),
    ({"clean": lambda ds: ds, "out/domain": lambda ds: ds}, {},
     "the evaluation set name 'out/domain' cannot be a TensorBoard run name "
     "(`eval/out/domain`): use letters, digits, `_`, `-` and `.`, starting "
     "with a letter or a digit."),
    (_TWO_SETS, dict(best_checkpoint=_best("mae")),
     "`best_checkpoint.metric` ('mae') names no evaluation set: results are "
     "named `<set>/<metric>` (e.g. 'clean/mae'), and the sets are: clean, "
     "noisy."),
    (_TWO_SETS, dict(best_checkpoint=_best("test/mae")),
     "`best_checkpoint.metric` ('test/mae') names no evaluation set: "
     "results are named `<set>/<metric>` (e.g. 'clean/mae'), and the sets "
     "are: clean, noisy."),
    (_TWO_SETS, dict(held_out_sets=("test",)),
     "`trainer.held_out_sets` names 'test', which is not an evaluation set "
     "of the Task; its sets are: clean, noisy."),
    (_TWO_SETS, dict(validation_steps={"noisy": 3}),
     "`trainer.validation_steps` (3) is more than the 2 batch(es) of the "
     "evaluation set 'noisy'; use -1 for one full pass."),
    (_TWO_SETS, dict(eval_sets=("noisy",), best_checkpoint=_best("clean/mae")),
     "`best_checkpoint.metric` ('clean/mae') is a result of the set 'clean', "
     "which `trainer.eval_sets` (noisy) leaves out: evaluate it too, or "
     "judge by a set evaluated."),
], ids=["empty set", "no set", "bad name", "metric of no set",
        "metric of an unknown set", "unknown held-out set", "steps of a set",
        "metric of a set not evaluated"])
def test_bad_eval_sets_are_one_line_and_write_nothing(tmp_path, sets,
                                                      overrides, message):
  model_dir = tmp_path / "run"
  with pytest.raises(trainer.ConfigError) as raised:
    experiment.run(_RegressionSets(sets), "train_and_eval", str(model_dir),
                   _runtime(), _config(**overrides))
  assert str(raised.value) == message
  assert not model_dir.exists()


def test_a_held_out_sets_metric_is_refused_with_the_settings(tmp_path):
  with pytest.raises(trainer.ConfigError) as raised:
    _config(held_out_sets=("noisy",), best_checkpoint=_best("noisy/mae"))
  assert str(raised.value).splitlines()[0] == (
      "`best_checkpoint.metric` ('noisy/mae') is a result of the held-out set "
      "'noisy' (`trainer.held_out_sets`), which is evaluated and reported "
      "but never judged: judge by another set's result.")


def test_a_named_set_empty_at_run_time_is_named(tmp_path):
  sets = {"clean": lambda ds: ds,
          "noisy": lambda ds: ds.filter(lambda x, y: False)}
  with pytest.raises(trainer.ConfigError) as raised:
    experiment.run(_RegressionSets(sets), "train_and_eval", str(tmp_path),
                   _runtime(), _config())
  assert str(raised.value) == (
      "the evaluation set 'noisy' yielded no example (filtered out "
      "entirely?); `build_inputs(training=False)` must return some.")


def test_continuous_eval_evaluates_every_set_of_every_checkpoint(tmp_path):
  model_dir = str(tmp_path)
  task = _RegressionSets(_TWO_SETS)
  experiment.run(task, "train", model_dir, _runtime(), _config())
  config = _config(continuous_eval_timeout=5, held_out_sets=("noisy",),
                   best_checkpoint=_best("clean/mae"),
                   early_stopping=trainer.actions.EarlyStoppingConfig(
                       metric="clean/loss",
                       higher_is_better=False))
  output = experiment.run(task, "continuous_eval", model_dir, _runtime(),
                          config)
  with open(tmp_path / "eval" / "evaluated.json") as f:
    record = json.load(f)
  assert record["steps"] == [10, 20]
  assert sorted(record["results"]["20"]) == ["clean/loss", "clean/mae",
                                             "noisy/loss", "noisy/mae"]
  assert record["results"]["20"] == pytest.approx(output)
  for name in ("clean", "noisy"):
    scalars = helpers.read_scalars(os.path.join(model_dir, "eval", name))
    assert scalars["mae"] == [
        (step, pytest.approx(record["results"][str(step)][f"{name}/mae"]))
        for step in (10, 20)]
  # The held-out set is evaluated and reported; the best follows clean.
  with open(tmp_path / "best" / "best.json") as f:
    best = json.load(f)
  clean = {int(step): results["clean/mae"]
           for step, results in record["results"].items()}
  assert best["metric"] == "clean/mae"
  assert best["value"] == pytest.approx(min(clean.values()))
  with open(tmp_path / "early_stopping.json") as f:
    stopping = json.load(f)
  assert stopping["metric"] == "clean/loss"
  assert stopping["values"] == {
      str(step): pytest.approx(record["results"][str(step)]["clean/loss"])
      for step in (10, 20)}
