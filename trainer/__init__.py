"""A gin-configured custom-training-loop framework on Orbit and tf.distribute.

Importing `trainer` selects Keras 2 (`tf_keras`): Model Garden and Orbit are
built on it, and the variable must be set before TensorFlow first touches
`tf.keras`.

The public names load lazily (PEP 562), each with the module that defines
it: `import trainer` costs no TensorFlow import, a Task module that only
subclasses `trainer.Task` loads the Task's modules, and `trainer.run` loads
the whole stack. `train.py` and the scripts import what they use.
"""

import importlib
import os
import typing

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TensorFlow's GCS file system caches stats and listings for 5 s: a record
# just replaced, or a folder just removed, would read as before. Read when
# the file system is made, so before TensorFlow loads.
os.environ.setdefault("GCS_STAT_CACHE_MAX_AGE", "0")

# Each public name, by the module that defines it.
_PUBLIC = {
    "ConfigError": "trainer.errors",
    "NonFiniteError": "trainer.errors",
    "Preempted": "trainer.errors",
    "RunError": "trainer.errors",
    "MODES": "trainer.experiment",
    "run": "trainer.experiment",
    "TrainerConfig": "trainer.config",
    "minimize": "trainer.model.gradients",
    "float32_outputs": "trainer.model.task",
    "Task": "trainer.model.task",
    "RuntimeConfig": "trainer.runtime",
}

__all__ = sorted(_PUBLIC)

if typing.TYPE_CHECKING:  # For type checkers and the API reference (griffe).
  # pylint: disable=g-import-not-at-top,unused-import
  from trainer.config import TrainerConfig
  from trainer.errors import ConfigError
  from trainer.errors import NonFiniteError
  from trainer.errors import Preempted
  from trainer.errors import RunError
  from trainer.experiment import MODES
  from trainer.experiment import run
  from trainer.model.gradients import minimize
  from trainer.model.task import float32_outputs
  from trainer.model.task import Task
  from trainer.runtime import RuntimeConfig


def __getattr__(name):
  module = _PUBLIC.get(name)
  if module is None:
    raise AttributeError(f"module 'trainer' has no attribute {name!r}")
  value = getattr(importlib.import_module(module), name)
  globals()[name] = value  # Looked up once.
  return value


def __dir__():
  return sorted(list(globals()) + __all__)
