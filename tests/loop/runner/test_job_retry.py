"""`job_retry`: training goes on with new tf.data service jobs, up to
`data_service.NEW_JOBS` in a row that yield nothing."""

import pytest
import tensorflow as tf

from trainer import errors
from trainer.data import service as data_service
from trainer.loop.runner import job_retry


def _lost(step: int) -> str:
  return f"warning | {data_service.new_job_line(step)}"


class _Service:
  """A train function over a service losing its job at given steps."""

  def __init__(self, trains):
    self.step = 0
    self.calls = []  # The steps each train call was asked for.
    self.pipelines = 0
    self._trains = list(trains)  # Steps trained by each call; None: done.

  def train(self, num_steps):
    self.calls.append(int(num_steps))
    trained = self._trains.pop(0)
    if trained is None:
      self.step += int(num_steps)
      return "output"
    self.step += trained
    raise tf.errors.NotFoundError(None, None, "Dataset id 1000 not found")

  def run(self, num_steps):
    return job_retry.train_on_new_jobs(
        self.train, tf.constant(num_steps, tf.int32), lambda: self.step,
        self._new_pipeline)

  def _new_pipeline(self):
    self.pipelines += 1


def test_a_lost_job_is_followed_by_a_new_one_for_the_remaining_steps(
    capsys):
  service = _Service([3, None])
  assert service.run(10) == "output"
  assert (service.calls, service.step, service.pipelines) == ([10, 7], 10, 1)
  assert capsys.readouterr().out.splitlines() == [_lost(3)]


def test_new_jobs_that_train_count_as_no_failure(capsys):
  # Every new job trains a step before it fails: never given up.
  service = _Service([1] * (data_service.NEW_JOBS + 2) + [None])
  assert service.run(10) == "output"
  assert service.calls == list(range(10, 10 - data_service.NEW_JOBS - 3, -1))
  lines = capsys.readouterr().out.splitlines()
  assert lines == [_lost(step) for step in range(1, data_service.NEW_JOBS
                                                 + 3)]


def test_new_jobs_that_yield_nothing_end_the_run(capsys):
  service = _Service([2] + [0] * data_service.NEW_JOBS)
  with pytest.raises(errors.RunError,
                     match=r"^the tf\.data service lost this run's job, "
                     rf"and {data_service.NEW_JOBS} new job\(s\) in a row"):
    service.run(10)
  assert service.pipelines == data_service.NEW_JOBS
  assert service.calls == [10] + [8] * data_service.NEW_JOBS
  assert capsys.readouterr().out.splitlines() == [_lost(2)]
