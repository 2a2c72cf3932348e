"""A gin-configured custom-training-loop framework on Orbit and tf.distribute.

Importing `trainer` selects Keras 2 (`tf_keras`): Model Garden and Orbit are
built on it, and the variable must be set before TensorFlow first touches
`tf.keras`.
"""

import importlib
import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# pylint: disable=g-import-not-at-top,wrong-import-position
from trainer.errors import ConfigError
from trainer.errors import NonFiniteError
from trainer.errors import Preempted
from trainer.errors import RunError
from trainer.experiment import MODES
from trainer.experiment import run
from trainer.experiment import TrainerConfig
from trainer.model.gradients import minimize
from trainer.model.task import float32_outputs
from trainer.model.task import Task
from trainer.runtime import RuntimeConfig

__all__ = ["ConfigError", "MODES", "NonFiniteError", "Preempted",
           "RunError", "RuntimeConfig", "Task", "TrainerConfig",
           "float32_outputs", "minimize", "run"]

# Modules the guides once imported as `from trainer import inputs`, before
# trainer/ had packages: such imports keep working.
_MOVED = {"inputs": "trainer.data.inputs",
          "data_loss": "trainer.data.data_loss",
          "placement": "trainer.distribute.placement"}


def __getattr__(name):
  if name in _MOVED:
    return importlib.import_module(_MOVED[name])
  raise AttributeError(f"module 'trainer' has no attribute {name!r}")
