"""`replica_step`: what a Task's `train_step` gets, and the settings an
overridden step refuses, one line each."""

import pytest
import tensorflow as tf

from trainer import errors
from trainer.loop.runner import replica_step
from trainer.model import gradients

import helpers


class _Recording(helpers.LinearRegression):

  def __init__(self):
    super().__init__()
    self.calls = []

  def train_step(self, inputs, model, optimizer, metrics=None, **kwargs):
    self.calls.append((inputs, model, optimizer, metrics, kwargs))
    return {"loss": tf.constant(1.0)}


def _build(task, model="model", options=gradients.StepOptions(),
           per_replica=8, replicas=1, xla=False):
  return replica_step.build(task, model, "optimizer", "metrics", options,
                            per_replica_batch_size=per_replica,
                            num_replicas=replicas, enable_xla=xla)


def test_an_overridden_step_gets_no_options():
  task = _Recording()
  assert float(_build(task)("batch")["loss"]) == 1.0
  assert task.calls == [("batch", "model", "optimizer", "metrics", {})]


def test_the_default_step_gets_the_options():
  options = gradients.StepOptions(accumulation_steps=2, clip_norm=1.0)
  task = helpers.LinearRegression()
  received = []
  # `overrides` looks at the class: this stand-in is the default step's.
  task.train_step = lambda *args, **kwargs: received.append((args, kwargs))
  _build(task, options=options)("batch")
  assert received == [(("batch", "model", "optimizer", "metrics"),
                       {"options": options})]


@pytest.mark.parametrize("task, kwargs, message", [
    (helpers.LinearRegression(),
     dict(per_replica=5, options=gradients.StepOptions(accumulation_steps=2)),
     "`trainer.global_batch_size` gives 5 example(s) per replica, which do "
     "not split into `trainer.gradient_accumulation_steps` (2) equal "
     "micro-batches."),
    (helpers.LinearRegression(), dict(model={"a": 1, "b": 2}),
     "LinearRegression builds several models (a, b): it must override "
     "`train_step`, which gets them and their optimizers by name."),
    (_Recording(), dict(options=gradients.StepOptions(clip_value=1.0)),
     "_Recording overrides `Task.train_step`, which then does its own "
     "gradient handling: `trainer.gradient_accumulation_steps`, "
     "`trainer.gradient_clip_norm`/`_value` and `runtime.enable_xla` on "
     "several replicas need the default step."),
    (_Recording(), dict(replicas=2, xla=True),
     "_Recording overrides `Task.train_step`, which then does its own "
     "gradient handling: `trainer.gradient_accumulation_steps`, "
     "`trainer.gradient_clip_norm`/`_value` and `runtime.enable_xla` on "
     "several replicas need the default step."),
    (_Recording(), dict(replicas=2, xla=True, model={"a": 1}),
     "`runtime.enable_xla` on several replicas compiles the default "
     "train_step's gradient pass; a Task with several models runs its own "
     "step: use one replica, or no XLA."),
])
def test_settings_the_step_cannot_take(task, kwargs, message):
  with pytest.raises(errors.ConfigError) as raised:
    _build(task, **kwargs)
  assert str(raised.value) == message
