"""trainer.distribute.roles: what each task of a cluster runs."""

import json

import pytest

import trainer
from trainer import errors
from trainer import runtime as runtime_lib
from trainer.distribute import cluster
from trainer.distribute import roles


def _tf_config(monkeypatch, task_type):
  monkeypatch.setenv("TF_CONFIG", json.dumps({
      "cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"],
                  "ps": ["127.0.0.1:3"]},
      "task": {"type": task_type, "index": 0}}))


def test_each_role_runs_its_own_mode(monkeypatch):
  runtime = runtime_lib.RuntimeConfig(distribution_strategy="parameter_server")
  membership = cluster.Membership()
  stop = trainer.TrainerConfig().on_nonfinite
  _tf_config(monkeypatch, "evaluator")
  evaluated, mode = roles.role_runtime(runtime, "continuous_eval", stop,
                                       membership)
  assert evaluated.distribution_strategy == "default"
  assert mode == "continuous_eval"
  with pytest.raises(errors.ConfigError, match="^the evaluator task runs "):
    roles.role_runtime(runtime, "train", stop, membership)
  _tf_config(monkeypatch, "chief")
  assert roles.role_runtime(runtime, "train", stop, membership) == (
      runtime, "train")
  with pytest.raises(errors.ConfigError, match="the chief runs --mode=train"):
    roles.role_runtime(runtime, "train_and_eval", stop, membership)
  with pytest.raises(errors.ConfigError, match="'rollback'` is not supported"):
    roles.role_runtime(
        runtime, "train",
        trainer.TrainerConfig(on_nonfinite="rollback").on_nonfinite,
        membership)
