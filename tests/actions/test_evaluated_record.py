"""The record of evaluated steps, kept across restarts."""

import json

import numpy as np
import tensorflow as tf

from trainer import actions
from trainer.storage import evaluated

import ram_urls


class _Step:
  """The global step an action reads; the test moves it."""

  def __init__(self, step=0):
    self.step = step

  def __call__(self):
    return self.step


def test_evaluated_step_recorder_keeps_every_step_across_restarts(tmp_path):
  step = _Step(10)
  actions.EvaluatedStepRecorder(str(tmp_path), step_fn=step)(
      {"mae": np.float32(0.5)})
  step.step = 20
  # A restarted run's recorder adds to what the first one recorded.
  actions.EvaluatedStepRecorder(str(tmp_path), step_fn=step)({"mae": 0.25})
  assert evaluated.steps(str(tmp_path)) == {10, 20}
  with open(tmp_path / evaluated.RECORD) as f:
    assert json.load(f) == {"steps": [10, 20],
                            "results": {"10": {"mae": 0.5},
                                        "20": {"mae": 0.25}}}


def test_the_steps_of_a_url_model_dir_are_recorded_there(tmp_path,
                                                        monkeypatch):
  model_dir = ram_urls.model_dir(tmp_path, monkeypatch)
  actions.EvaluatedStepRecorder(model_dir, step_fn=_Step(10))({"mae": 0.5})
  actions.EvaluatedStepRecorder(model_dir, step_fn=_Step(20))({"mae": 0.25})
  with tf.io.gfile.GFile(f"{model_dir}/{evaluated.RECORD}") as f:
    assert json.load(f) == {"steps": [10, 20],
                            "results": {"10": {"mae": 0.5},
                                        "20": {"mae": 0.25}}}
  assert ram_urls.nothing_local(tmp_path)
