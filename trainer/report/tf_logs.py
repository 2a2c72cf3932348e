"""TensorFlow's start-up lines that are not about the user's run.

On a machine without an NVIDIA GPU, TensorFlow's CUDA build probes for one
when it first lists devices and logs, at ERROR (so `TF_CPP_MIN_LOG_LEVEL=2`
shows it, and 3 would hide real errors too):

  E ... cuda_platform.cc:51] failed call to cuInit: INTERNAL: CUDA error:
  Failed call to cuInit: UNKNOWN ERROR (303)

`probe_devices` runs that first listing with the process's stderr (file
descriptor 2, where TensorFlow's C++ logs go) sent to a temporary file, then
writes back every line but that one, and that one too where a GPU device
node exists (`/dev/nvidia0`, ...: then it is a real driver problem).
`keep_python_warnings_single` makes TensorFlow's Python warnings print once,
not once by TensorFlow's handler and again by absl's, and turns the
mixed-precision compatibility block (four lines) into one;
`condense_coordinator_logs` cuts the parameter-server coordinator's reports
of failed steps to their first line; `apply_min_log_level_to_absl` makes
`TF_CPP_MIN_LOG_LEVEL` (2 unless the user sets it) apply to the C++ lines
TensorFlow logs through abseil too. `route_keras_notices` makes two of
Keras's notices about the model (weights without gradients, input keys
no input takes: a Model Garden BERT gets both) `warning |` lines, once
each, instead of stderr lines.
"""

import ctypes
import glob
import logging
import os
import sys
import tempfile
import warnings
from typing import List

import tensorflow as tf

from trainer import console

_NO_GPU_PROBE = "failed call to cuInit"
_COMPATIBILITY = "Mixed precision compatibility check"
_COORDINATOR = "tensorflow/python/distribute/coordinator/"


def _has_gpu_device_node() -> bool:
  return bool(glob.glob("/dev/nvidia[0-9]*") or  # local-path: device nodes
              os.path.exists("/dev/dxg"))  # local-path: a device node


def probe_devices() -> List[tf.config.PhysicalDevice]:
  """Lists the physical devices (TensorFlow's first device probe), without
  the CUDA probe's error line where there is no GPU.

  Later calls probe nothing: TensorFlow keeps the list.
  """
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as captured:  # local-path: our own stderr
    os.dup2(captured.fileno(), 2)
    try:
      devices = tf.config.list_physical_devices()
    finally:
      os.dup2(saved, 2)
      os.close(saved)
    captured.seek(0)
    lines = captured.read().decode("utf-8", "replace").splitlines(True)
  gpu_node = _has_gpu_device_node()
  for line in lines:
    if gpu_node or _NO_GPU_PROBE not in line:
      sys.stderr.write(line)
  sys.stderr.flush()
  return devices


class _CompatibilityToOneLine(logging.Filter):
  """Replaces the mixed-precision compatibility block by one warning."""

  def filter(self, record: logging.LogRecord) -> bool:
    message = record.getMessage()
    if not message.startswith(_COMPATIBILITY):
      return True
    # The block's second line says why, e.g. "The dtype policy
    # mixed_float16 may run slowly because this machine does not have a
    # GPU. Only Nvidia GPUs with compute capability of at least 7.0 run
    # quickly with mixed_float16."
    why = (message.splitlines()[1:2] or [message])[0]
    console.warning(why.split(". Only")[0].rstrip(".") +
                    " (compute capability 7.0 or more runs it fast)")
    return False


class _CoordinatorToFirstLines(logging.Filter):
  """Keeps the first line of each of the parameter-server coordinator's
  reports, once.

  Each report of a failed step carries gRPC's whole error (measured: 45
  lines for one lost ps before the run's own error line); its first line
  says who failed how.
  """

  def __init__(self):
    super().__init__()
    self._seen = set()

  def filter(self, record: logging.LogRecord) -> bool:
    if _COORDINATOR not in record.pathname.replace(os.sep, "/"):
      return True
    first = record.getMessage().strip().split("\n", 1)[0]
    first = first.removesuffix("Graph execution error:").rstrip(" :")
    if first in self._seen:
      return False
    self._seen.add(first)
    record.msg, record.args = first, ()
    return True


def condense_coordinator_logs() -> None:
  """Cuts the parameter-server coordinator's reports to their first line,
  each once (`_CoordinatorToFirstLines`)."""
  logger = tf.get_logger()
  if not any(isinstance(f, _CoordinatorToFirstLines) for f in logger.filters):
    logger.addFilter(_CoordinatorToFirstLines())


# `absl::SetMinLogLevel(absl::LogSeverityAtLeast)` of the abseil release
# TensorFlow 2.20 is built with (tests check it is there).
_ABSL_SET_MIN_LOG_LEVEL = (
    "_ZN4absl12lts_2025012714SetMinLogLevelENS0_18LogSeverityAtLeastE")


def apply_min_log_level_to_absl() -> bool:
  """Gives TensorFlow's abseil logs the level `TF_CPP_MIN_LOG_LEVEL` sets.

  Some of TensorFlow's C++ code logs through abseil (lines such as
  `W0000 00:00:... data_service_client.cc:478] Failed to heartbeat to
  dispatcher ...`, once a second while a tf.data service dispatcher is
  down, measured), which `TF_CPP_MIN_LOG_LEVEL` does not reach and Python
  cannot configure; its `SetMinLogLevel` is exported by
  `libtensorflow_framework`. Levels are the same numbers (0 INFO to 3
  FATAL). Returns False where the function is not found.
  """
  level = os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0")
  if not level.isdigit():
    return False
  library = os.path.join(os.path.dirname(tf.__file__),
                         "libtensorflow_framework.so.2")
  try:
    function = getattr(ctypes.CDLL(library), _ABSL_SET_MIN_LOG_LEVEL)
  except (OSError, AttributeError):
    return False
  function(ctypes.c_int(min(int(level), 3)))
  return True


def keep_python_warnings_single() -> None:
  """TensorFlow's Python warnings once each, the compatibility check in one
  line."""
  logger = tf.get_logger()
  # TensorFlow's own handler prints them; absl's (on the root logger) would
  # print each again in its raw format.
  logger.propagate = False
  if not any(isinstance(f, _CompatibilityToOneLine) for f in logger.filters):
    logger.addFilter(_CompatibilityToOneLine())


# Keras's notices about the model, as it words them: the optimizer's (TF's
# logger, each time a step is traced) and the functional model's (a Python
# warning).
_NO_GRADIENTS = "Gradients do not exist for variables "
_NO_GRADIENTS_ADVICE = " when minimizing the loss."
_UNUSED_INPUT_KEYS = "Input dict contained keys "


def _said_once(seen: set, message: str) -> None:
  if message not in seen:
    seen.add(message)
    console.warning(message)


class _NoGradientsToLine(logging.Filter):
  """Says the optimizer's "Gradients do not exist for variables [...]" once
  per variable list, as a `warning |` line, without its advice for
  `model.compile()` (no run here compiles a loss)."""

  def __init__(self):
    super().__init__()
    self._seen = set()

  def filter(self, record: logging.LogRecord) -> bool:
    message = record.getMessage()
    if not message.startswith(_NO_GRADIENTS):
      return True
    variables = message[len(_NO_GRADIENTS):].split(_NO_GRADIENTS_ADVICE)[0]
    _said_once(self._seen, f"{_NO_GRADIENTS}{variables}: the loss does not "
               "depend on them, so they do not train")
    return False


def route_keras_notices() -> None:
  """Says Keras's notices about the model once each as `warning |` lines:
  weights without gradients (`_NoGradientsToLine`), and input dict keys
  that match no input of a functional model (which ignores them). Other
  Python warnings are shown as before."""
  logger = tf.get_logger()
  if not any(isinstance(f, _NoGradientsToLine) for f in logger.filters):
    logger.addFilter(_NoGradientsToLine())
  shown = warnings.showwarning
  if getattr(shown, "routes_keras_notices", False):
    return
  seen = set()

  def showwarning(message, category, filename, lineno, file=None,
                  line=None):
    text = str(message)
    if text.startswith(_UNUSED_INPUT_KEYS):
      _said_once(seen, text.split(" They will be ignored")[0].rstrip(".") +
                 ": the model ignores them")
      return
    shown(message, category, filename, lineno, file, line)

  showwarning.routes_keras_notices = True
  warnings.showwarning = showwarning
