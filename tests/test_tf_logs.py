"""TensorFlow's log records cut to what concerns the run."""

import logging

from trainer import tf_logs

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
