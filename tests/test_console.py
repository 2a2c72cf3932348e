"""trainer/console.py: each line shows once on a terminal, and is logged
with the same text when absl's log goes to a file."""

import io
import logging
import sys

from absl import logging as absl_logging
import pytest

from trainer import console


@pytest.fixture
def absl_stream(monkeypatch):
  """Sets where absl's handler writes; returns a setter."""
  handler = absl_logging.get_absl_handler().python_handler

  def set_stream(stream):
    monkeypatch.setattr(handler, "stream", stream)

  return set_stream


def test_info_prints_and_logs_the_line_when_the_log_is_a_file(
    capsys, caplog, absl_stream):
  absl_stream(io.StringIO())  # Stands in for a log file.
  with caplog.at_level(logging.INFO, logger="absl"):
    console.info("train | step 10/20")
  assert capsys.readouterr().out == "train | step 10/20\n"
  assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
      (logging.INFO, "train | step 10/20")]


def test_warning_prints_a_marked_line_and_logs_a_warning(
    capsys, caplog, absl_stream):
  absl_stream(io.StringIO())
  with caplog.at_level(logging.INFO, logger="absl"):
    console.warning("input-bound: 30%")
  assert capsys.readouterr().out == "warning | input-bound: 30%\n"
  assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
      (logging.WARNING, "input-bound: 30%")]


@pytest.mark.parametrize("stream", [sys.__stderr__, "sys.stderr"])
def test_lines_are_not_logged_again_to_the_terminal(capsys, caplog,
                                                    absl_stream, stream):
  absl_stream(sys.stderr if stream == "sys.stderr" else stream)
  with caplog.at_level(logging.INFO, logger="absl"):
    console.warning("input-bound: 30%")
    console.info("train | step 10/20")
  assert capsys.readouterr().out == ("warning | input-bound: 30%\n"
                                     "train | step 10/20\n")
  assert not caplog.records


def test_error_goes_to_stderr_once_on_a_terminal(capsys, caplog, absl_stream):
  absl_stream(sys.stderr)
  with caplog.at_level(logging.ERROR, logger="absl"):
    console.error("train.py: error: bad")
  captured = capsys.readouterr()
  assert captured.err == "train.py: error: bad\n" and captured.out == ""
  assert caplog.record_tuples == []


def test_held_lines_follow_the_lines_released_first(capsys):
  with console.held() as release:
    console.info("optimizer | generator: Adam")
    console.warning("never held")
    console.info("restored checkpoint run/ckpt-2 at step 2")
    assert capsys.readouterr().out == "warning | never held\n"
    release(["run | GAN, train in run: resuming from ckpt-2, step 2"])
    console.info("train | step 4/4")
  assert capsys.readouterr().out.splitlines() == [
      "run | GAN, train in run: resuming from ckpt-2, step 2",
      "optimizer | generator: Adam",
      "restored checkpoint run/ckpt-2 at step 2",
      "train | step 4/4"]


def test_held_lines_are_printed_when_the_block_fails(capsys):
  with pytest.raises(ValueError):
    with console.held():
      console.info("optimizer | generator: Adam")
      with console.held() as inner:  # Nested: the outer block holds.
        console.info("placement | a")
        inner(["run | header"])
      raise ValueError("bad")
  assert capsys.readouterr().out.splitlines() == [
      "optimizer | generator: Adam", "placement | a", "run | header"]
