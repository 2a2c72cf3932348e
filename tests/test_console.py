"""trainer/console.py: each line is printed and logged with the same text."""

import logging

from trainer import console


def test_info_prints_and_logs_the_line(capsys, caplog):
  with caplog.at_level(logging.INFO, logger="absl"):
    console.info("train | step 10/20")
  assert capsys.readouterr().out == "train | step 10/20\n"
  assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
      (logging.INFO, "train | step 10/20")]


def test_warning_prints_a_marked_line_and_logs_a_warning(capsys, caplog):
  with caplog.at_level(logging.INFO, logger="absl"):
    console.warning("input-bound: 30%")
  assert capsys.readouterr().out == "warning | input-bound: 30%\n"
  assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
      (logging.WARNING, "input-bound: 30%")]
