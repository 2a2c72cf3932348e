"""Early stopping (`early_stopping.*`): evaluations without improvement,
counted across processes and restarts."""

import trainer
from trainer import actions
from trainer import experiment
from trainer.model import optimization

import helpers
import ram_urls


class _Step:
  """The global step an action reads; the test moves it."""

  def __init__(self, step=0):
    self.step = step

  def __call__(self):
    return self.step


def _early(model_dir, step, patience=2, min_delta=0.0):
  model_dir.mkdir(exist_ok=True)  # As a run makes it before its actions.
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


def test_the_record_of_a_url_model_dir_is_kept_and_read_there(tmp_path,
                                                              monkeypatch):
  model_dir = ram_urls.model_dir(tmp_path, monkeypatch)
  config = actions.EarlyStoppingConfig(metric="loss", higher_is_better=False,
                                       patience=2)
  trainer_side = actions.EarlyStopping(model_dir, config, step_fn=_Step())
  evaluator_step = _Step()
  evaluator = actions.EarlyStopping(model_dir, config, step_fn=evaluator_step)
  for evaluator_step.step, loss in ((10, 0.5), (20, 0.6)):
    evaluator({"loss": loss})
  assert trainer_side.stop_reason() is None
  # The object's time does not change (`ram://`: 0); its content does.
  evaluator_step.step = 30
  evaluator({"loss": 0.7})
  assert trainer_side.stop_reason() == (
      "loss has not improved on 0.5000 (step 10) for 2 evaluations "
      "(patience 2)")
  assert ram_urls.names(model_dir) == [".identity",
                                       actions.EARLY_STOPPING_RECORD]
  assert ram_urls.nothing_local(tmp_path)
