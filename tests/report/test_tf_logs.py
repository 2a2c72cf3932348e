"""TensorFlow's log records cut to what concerns the run."""

import logging
import os
import subprocess
import sys
import textwrap

import pytest

import helpers
from trainer.report import tf_logs

_COORDINATOR_FILE = ("/venv/lib/python3.11/site-packages/tensorflow/python/"
                     "distribute/coordinator/cluster_coordinator.py")


def _record(pathname, message):
  return logging.LogRecord("tensorflow", logging.ERROR, pathname, 1, message,
                           (), None)


def test_the_coordinators_reports_keep_their_first_line_once():
  condense = tf_logs._CoordinatorToFirstLines()  # pylint: disable=protected-access
  report = _record(_COORDINATOR_FILE,
                   "Remote function on worker /job:worker/replica:0/task:0 "
                   "failed with UnavailableError():Graph execution error:\n\n"
                   "failed to connect to all addresses; ...\n"
                   "Additional GRPC error information ...")
  assert condense.filter(report)
  assert report.getMessage() == ("Remote function on worker /job:worker/"
                                 "replica:0/task:0 failed with "
                                 "UnavailableError()")
  again = _record(_COORDINATOR_FILE, report.getMessage() + "\nmore")
  assert not condense.filter(again)
  # Other modules' records pass as they are.
  other = _record("/x/tensorflow/python/eager/def_function.py", "a\nb")
  assert condense.filter(other) and other.getMessage() == "a\nb"


_DISPATCHER_GOES_DOWN = textwrap.dedent('''
    import os, sys, time
    import trainer  # Sets TF_CPP_MIN_LOG_LEVEL=2, as train.py.
    import tensorflow as tf
    from trainer.report import tf_logs
    if sys.argv[1] == "quiet":
      assert tf_logs.apply_min_log_level_to_absl()
    service = tf.data.experimental.service
    dispatcher = service.DispatchServer()
    worker = service.WorkerServer(service.WorkerConfig(
        dispatcher_address=dispatcher.target.split("://")[1]))
    batches = iter(tf.data.Dataset.range(10**9).apply(service.distribute(
        "distributed_epoch", dispatcher.target)))
    next(batches)
    dispatcher.stop()
    time.sleep(4)  # The client heartbeats to it once a second.
    print("done", flush=True)
    os._exit(0)  # The service's threads would hold the exit.
''')


@pytest.mark.parametrize("mode, heartbeat_lines", [
    # A data service and a client process each (~10 s): the quiet default
    # in the default suite, the loud one with the slow tests.
    pytest.param("loud", True, marks=pytest.mark.slow), ("quiet", False)])
def test_abseil_lines_follow_tf_cpp_min_log_level(mode, heartbeat_lines):
  env = dict(os.environ)
  env.pop("TF_CPP_MIN_LOG_LEVEL", None)
  result = subprocess.run(
      [sys.executable, "-c", _DISPATCHER_GOES_DOWN, mode],
      cwd=helpers.REPO_ROOT, env=env, capture_output=True, text=True,
      timeout=120)
  assert result.stdout.strip().endswith("done"), result.stderr[-2000:]
  assert ("Failed to heartbeat to dispatcher" in result.stderr) == (
      heartbeat_lines), result.stderr[-2000:]


def test_keras_notices_about_the_model_are_warning_lines_once(monkeypatch,
                                                              capsys):
  # pylint: disable=g-import-not-at-top
  import warnings
  import tensorflow as tf
  monkeypatch.setattr(tf.get_logger(), "filters", [])
  shown = []  # What Python's warnings show without the routing.
  monkeypatch.setattr(warnings, "showwarning",
                      lambda message, *unused: shown.append(str(message)))
  tf_logs.route_keras_notices()
  tf_logs.route_keras_notices()  # A second call adds nothing.
  for _ in range(2):  # The optimizer's, at each trace; Keras's functional's.
    tf.get_logger().warning(
        "Gradients do not exist for variables %s when minimizing the loss. "
        "If you're using `model.compile()`, did you forget to provide a "
        "`loss` argument?", ["pooler_transform/kernel:0"])
    warnings.warn_explicit(
        "Input dict contained keys ['label_ids'] which did not match any "
        "model input. They will be ignored by the model.", UserWarning,
        "functional.py", 641)
  warnings.warn_explicit("another warning", UserWarning, "other.py", 1)
  printed = capsys.readouterr()
  assert printed.out.splitlines() == [
      "warning | Gradients do not exist for variables "
      "['pooler_transform/kernel:0']: the loss does not depend on them, so "
      "they do not train",
      "warning | Input dict contained keys ['label_ids'] which did not "
      "match any model input: the model ignores them"]
  assert printed.err == ""
  # Other warnings are shown as before.
  assert shown == ["another warning"]
