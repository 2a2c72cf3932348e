"""`TrainerConfig`: every bad value is one line naming the setting."""

import pytest

import trainer
from trainer import actions
from trainer.storage import exports


def _config(**overrides):
  settings = dict(train_steps=20, steps_per_loop=10, summary_interval=10,
                  checkpoint_interval=10)
  settings.update(overrides)
  return trainer.TrainerConfig(**settings)


@pytest.mark.parametrize("overrides,message", [
    (dict(train_steps=0), "`trainer.train_steps` (0) must be positive."),
    (dict(steps_per_loop="10"),
     "`trainer.steps_per_loop` ('10') must be an integer."),
    (dict(summary_interval=15),
     "`trainer.summary_interval` (15) must be a multiple of "
     "`trainer.steps_per_loop` (10)."),
    (dict(checkpoint_interval=15),
     "`trainer.checkpoint_interval` (15) must be a multiple of "
     "`trainer.steps_per_loop` (10)."),
    (dict(validation_interval=25),
     "`trainer.validation_interval` (25) must be a multiple of "
     "`trainer.steps_per_loop` (10)."),
    (dict(validation_steps=0),
     "`trainer.validation_steps` (0) must be positive, or -1 for a full "
     "pass."),
    (dict(gradient_accumulation_steps=0),
     "`trainer.gradient_accumulation_steps` (0) must be positive."),
    (dict(gradient_clip_norm=-1.0),
     "`trainer.gradient_clip_norm` (-1.0) must be a positive number or "
     "None."),
    (dict(keep_until_evaluated="yes"),
     "`trainer.keep_until_evaluated` ('yes') must be True or False."),
    (dict(profile_steps=(30, 20)),
     "`trainer.profile_steps` ((30, 20)) must be (start, end) with 0 <= "
     "start < end."),
    (dict(profile_steps=[5]),
     "`trainer.profile_steps` ([5]) must be (start, end) with 0 <= start < "
     "end."),
    (dict(export=exports.ExportConfig(best=True)),
     "`export.best` needs `best_checkpoint.metric`: it exports each new best "
     "checkpoint."),
    (dict(on_nonfinite="skip"),
     "`trainer.on_nonfinite` ('skip') must be one of: stop, rollback."),
    (dict(preemption_grace_seconds=0),
     "`trainer.preemption_grace_seconds` (0) must be a positive number of "
     "seconds, below the scheduler's grace period before SIGKILL."),
    (dict(validation_steps={"clean": 0}),
     "`trainer.validation_steps['clean']` (0) must be positive, or -1 for a "
     "full pass."),
    (dict(validation_steps={"a/b": 3}),
     "the evaluation set name 'a/b' cannot be a TensorBoard run name "
     "(`eval/a/b`): use letters, digits, `_`, `-` and `.`, starting with a "
     "letter or a digit."),
    (dict(eval_sets="clean"),
     "`trainer.eval_sets` ('clean') must be a tuple of set names, e.g. "
     "(\"clean\",)."),
    (dict(eval_sets=()),
     "`trainer.eval_sets` (()) must be a tuple of set names, e.g. "
     "(\"clean\",)."),
    (dict(held_out_sets=("test set",)),
     "the evaluation set name 'test set' cannot be a TensorBoard run name "
     "(`eval/test set`): use letters, digits, `_`, `-` and `.`, starting "
     "with a letter or a digit."),
    (dict(held_out_sets=("test",),
          best_checkpoint=actions.BestCheckpointConfig(
              metric="test/accuracy", higher_is_better=True)),
     "`best_checkpoint.metric` ('test/accuracy') is a result of the held-out "
     "set 'test' (`trainer.held_out_sets`), which is evaluated and reported "
     "but never judged: judge by another set's result."),
    (dict(held_out_sets=["test"],
          early_stopping=actions.EarlyStoppingConfig(
              metric="test/loss", higher_is_better=False)),
     "`early_stopping.metric` ('test/loss') is a result of the held-out set "
     "'test' (`trainer.held_out_sets`), which is evaluated and reported but "
     "never judged: judge by another set's result."),
    (dict(preemption_grace_seconds="25"),
     "`trainer.preemption_grace_seconds` ('25') must be a positive number "
     "of seconds, below the scheduler's grace period before SIGKILL."),
])
def test_bad_values_are_one_clear_line(overrides, message):
  with pytest.raises(trainer.ConfigError) as raised:
    _config(**overrides)
  # Gin adds a line naming the configurable; the command line keeps the
  # first.
  assert str(raised.value).splitlines()[0] == message


def test_eval_set_settings_and_the_steps_each_evaluation_asks():
  config = _config(validation_steps={"clean": 3}, eval_sets=["clean"],
                   held_out_sets=["test"],
                   best_checkpoint=actions.BestCheckpointConfig(
                       metric="clean/accuracy", higher_is_better=True))
  assert (config.eval_sets, config.held_out_sets) == (("clean",), ("test",))
  assert config.eval_steps == -1  # Each set's own count, by the evaluator.
  assert _config(validation_steps=5).eval_steps == 5
  assert _config().eval_steps == -1
  assert (_config().eval_sets, _config().held_out_sets) == (None, ())


def test_sub_configurations_default_and_profile_steps_become_a_tuple():
  config = _config(profile_steps=[10, 20],
                   best_checkpoint=actions.BestCheckpointConfig(
                       metric="accuracy", higher_is_better=True),
                   export=exports.ExportConfig(best=True))
  assert config.profile_steps == (10, 20)
  assert config.optimizer.name == "adam"
  assert config.learning_rate.schedule == "constant"
  assert not config.ema.enabled
  assert config.warm_start.checkpoint is None
  assert config.early_stopping.metric is None
