"""`summary_window`: the window's means of what the steps report, its
other scalars and their mistakes."""

import contextlib

import pytest
import tensorflow as tf

from trainer import errors
from trainer.loop.runner import summary_window


def _window():
  return summary_window.SummaryWindow(tf.distribute.get_strategy(), "Task",
                                      contextlib.nullcontext)


def _add(window, loss, waited=0.0, **logs):
  logs = {name: tf.constant(value) for name, value in logs.items()}
  window.add(tf.constant(loss), {"loss": tf.constant(loss), **logs},
             tf.constant(waited, tf.float64))


def test_means_over_the_steps_and_a_reset():
  window = _window()
  _add(window, 1.0, waited=0.5, gradient_norm=2.0, penalty=3.0)
  _add(window, 3.0, waited=0.25, gradient_norm=4.0, penalty=5.0)
  results, waited = window.read_and_reset()
  assert results == {"loss": 2.0, "gradient_norm": 3.0, "penalty": 4.0}
  assert waited == 0.75 and window.reports_norm
  _add(window, 5.0, gradient_norm=1.0, penalty=1.0)
  assert window.read_and_reset() == (
      {"loss": 5.0, "gradient_norm": 1.0, "penalty": 1.0}, 0.0)


def test_an_empty_window_reads_zero_without_a_norm():
  assert _window().read_and_reset() == ({"loss": 0.0}, 0.0)


def test_a_skipped_steps_norm_is_left_out_of_the_mean():
  window = _window()
  _add(window, 1.0, gradient_norm=float("inf"))
  _add(window, 1.0, gradient_norm=6.0)
  assert window.read_and_reset()[0]["gradient_norm"] == 6.0


def test_other_values_are_warned_about_once(capsys):
  window = _window()
  _add(window, 1.0, embedding=[1.0, 2.0], name="x")
  _add(window, 1.0, embedding=[1.0, 2.0], name="x")
  assert capsys.readouterr().out.splitlines() == [
      "warning | Task.train_step returned `embedding` ((2,)): only scalars "
      "go to the train summaries",
      "warning | Task.train_step returned `name` (()): only scalars go to "
      "the train summaries"]
  assert window.read_and_reset() == ({"loss": 1.0}, 0.0)


def test_other_scalars_must_keep_their_keys():
  window = _window()
  _add(window, 1.0, penalty=1.0)
  with pytest.raises(errors.ConfigError) as raised:
    _add(window, 1.0, bonus=1.0)
  assert str(raised.value) == (
      "Task.train_step returned the scalars ['bonus'], then ['penalty']: "
      "return the same keys in every step.")
