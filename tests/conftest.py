"""Test setup: Keras 2, two logical CPUs, clean gin state per test.

The CPU split must happen before TensorFlow initialises its devices, so it
is done here, before any test module touches TensorFlow.
"""

import gc
import os
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

import trainer  # noqa: E402,F401  Sets TF_USE_LEGACY_KERAS before TF loads.
import gin  # noqa: E402
import pytest  # noqa: E402
# pylint: disable-next=g-direct-tensorflow-import
from tensorflow.python.framework import config as framework_config  # noqa

import tf_keras  # noqa: E402

from trainer.distribute import devices  # noqa: E402

NUM_CPU_DEVICES = 2
# Epoch seconds after which no further test starts (`.ci/run` sets it for
# the slow tests, so that CI ends within its time limit).
START_BY = "TRAINER_TESTS_START_BY"
devices.split_cpu(NUM_CPU_DEVICES, "tests/conftest.py NUM_CPU_DEVICES")


@pytest.fixture(autouse=True)
def clean_global_state():
  """Clears gin bindings, the mixed-precision policy and op determinism
  (which `runtime.deterministic` turns on for the process) around each
  test."""
  gin.clear_config(clear_constants=True)
  yield
  gin.clear_config(clear_constants=True)
  tf_keras.mixed_precision.set_global_policy("float32")
  framework_config.disable_op_determinism()


@pytest.fixture(autouse=True)
def freeze_earlier_objects():
  """Moves every object that exists before a test (garbage not yet
  collected too) out of the garbage collector's sight (`gc.freeze`).

  Late in a session, earlier tests leave millions of objects (1.65 million
  after half the suite), and each full collection scanned them all: 2 s a
  collection, 40 s of one 41-s test, 113 s of the first half of the suite
  (measured). Frozen, a collection scans only what the running test made:
  that half ran in 713 s instead of 839 s, its peak memory 2.4 GB.
  """
  gc.freeze()


def pytest_configure(config):
  del config  # Unused.
  value = os.environ.get(START_BY)
  if value is not None and not value.isdigit():
    raise pytest.UsageError(
        f"{START_BY}={value!r}: expected epoch seconds (`date +%s`)")


def pytest_collection_modifyitems(config, items):
  """Runs the manual's pages (`test_docs.test_the_page_runs_as_written`)
  after every other test: most of their commands are ones other tests run
  too, so where `TRAINER_TESTS_START_BY` ends a run early, they are what it
  leaves out."""
  del config  # Unused.
  pages = [item for item in items
           if item.originalname == "test_the_page_runs_as_written"]
  items[:] = [item for item in items if item not in pages] + pages


def pytest_runtest_setup(item):
  """Skips a test that would start after `TRAINER_TESTS_START_BY`, with the
  reason listed in the summary (`-rs`)."""
  del item  # Unused.
  value = os.environ.get(START_BY)
  if value is not None and time.time() > int(value):
    deadline = time.strftime("%H:%M:%S", time.localtime(int(value)))
    pytest.skip(f"not started: {START_BY} ({deadline}) has passed")
