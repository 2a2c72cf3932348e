"""Test setup: Keras 2, two logical CPUs, clean gin state per test.

The CPU split must happen before TensorFlow initialises its devices, so it
is done here, before any test module touches TensorFlow.
"""

import gc
import itertools
import os
import re
import shutil
import subprocess
import sys

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
_LOCAL_SLURM = os.path.join(REPO_ROOT, "scripts", "local_slurm.sh")
devices.split_cpu(NUM_CPU_DEVICES, "tests/conftest.py NUM_CPU_DEVICES")


@pytest.hookimpl(tryfirst=True)  # Before `-m` selects by it.
def pytest_collection_modifyitems(items):
  """Marks `slurm` every test that starts the local SLURM cluster (takes
  `slurm_env`): `.ci/run` runs those one after another, beside the other
  `serial` tests one after another."""
  for item in items:
    if "slurm_env" in getattr(item, "fixturenames", ()):
      item.add_marker(pytest.mark.slurm)


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


def _slurm_unavailable():
  """Why the local SLURM cluster cannot run here, or None."""
  if os.geteuid() != 0:
    return "the local SLURM cluster (scripts/local_slurm.sh) runs as root"
  missing = [command for command in ("munged", "slurmctld", "slurmd", "srun",
                                     "sbatch", "scontrol", "squeue")
             if shutil.which(command) is None]
  if missing:
    return (f"{', '.join(missing)} not installed: apt-get install -y "
            "slurm-wlm munge (.ci/run does, as root)")
  return None


@pytest.fixture(scope="module")
def slurm_env(tmp_path_factory):
  """Starts the one-node cluster; yields the environment to run its
  commands in (SLURM_CONF); stops it at the end."""
  reason = _slurm_unavailable()
  if reason:
    pytest.skip(reason)
  directory = str(tmp_path_factory.mktemp("slurm"))
  started = subprocess.run(["bash", _LOCAL_SLURM, "start", directory],
                           capture_output=True, text=True, timeout=120)
  if started.returncode:
    pytest.fail(f"local SLURM cluster did not start: {started.stderr}")
  env = dict(os.environ, SLURM_CONF=os.path.join(directory, "slurm.conf"),
             PYTHONUNBUFFERED="1", PYTHON=sys.executable)
  for name in [name for name in env if name.startswith("SLURM_") and
               name != "SLURM_CONF"] + ["TF_CONFIG"]:
    env.pop(name, None)  # Not a job of an outer SLURM.
  yield env
  subprocess.run(["bash", _LOCAL_SLURM, "stop", directory],
                 capture_output=True, timeout=120)


_gcs_bucket_numbers = itertools.count(1)


@pytest.fixture(scope="session")
def gcs_emulator():
  """One local GCS for this pytest process (tests/gcs_emulator.py), its
  `environment` in `os.environ` (child processes inherit it) until the end
  of the session, when os.environ is restored.

  The variables are set when the first test that takes it starts; the one
  read when TensorFlow loads, `GCS_STAT_CACHE_MAX_AGE=0`, was set by
  `import trainer` above. Every https request of this process and its
  children goes through the proxy meanwhile: any host but GCS's two is
  refused. The emulator comes with the `test` extra: a missing one is an
  error, not a skip.
  """
  import gcs_emulator as emulator  # pylint: disable=g-import-not-at-top
  with emulator.GcsEmulator(buckets=("bucket",)) as gcs:
    saved = {name: os.environ.get(name) for name in gcs.environment}
    os.environ.update(gcs.environment)
    try:
      yield gcs
    finally:
      for name, value in saved.items():
        if value is None:
          os.environ.pop(name, None)
        else:
          os.environ[name] = value


@pytest.fixture
def gcs_bucket(gcs_emulator, request):  # pylint: disable=redefined-outer-name
  """`gs://NAME` of a new empty bucket for this test, named after it."""
  name = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")
  return gcs_emulator.new_bucket(
      f"{name[:50].strip('-') or 'test'}-{next(_gcs_bucket_numbers)}")
