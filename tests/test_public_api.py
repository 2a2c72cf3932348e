"""The public API (`trainer/__init__.py`): cheap to import, every name
there."""

import subprocess
import sys

import helpers
import trainer
from trainer import config
from trainer import experiment
from trainer.model import task


def test_import_trainer_loads_no_tensorflow():
  # A subprocess: this one has TensorFlow loaded by conftest.
  loaded = subprocess.run(
      [sys.executable, "-c",
       "import os, sys, trainer; "
       "print(sorted(m for m in ('tensorflow', 'tf_keras', 'orbit', 'gin') "
       "if m in sys.modules), os.environ['TF_USE_LEGACY_KERAS'])"],
      capture_output=True, text=True, timeout=60, cwd=helpers.REPO_ROOT,
      check=True)
  assert loaded.stdout.split() == ["[]", "1"]


def test_every_public_name_is_its_module_s_object():
  for name in trainer.__all__:
    assert getattr(trainer, name) is not None, name
  assert trainer.Task is task.Task
  assert trainer.run is experiment.run
  assert trainer.TrainerConfig is config.TrainerConfig
  assert set(trainer.__all__) <= set(dir(trainer))


def test_an_unknown_name_is_an_attribute_error():
  try:
    trainer.inputs  # pylint: disable=pointless-statement
  except AttributeError as error:
    assert str(error) == "module 'trainer' has no attribute 'inputs'"
  else:
    raise AssertionError("trainer.inputs resolved")
