"""trainer/console.py: each line shows once on a terminal, and is logged
with the same text when absl's log goes to a file."""

import ast
import io
import logging
import os
import pathlib
import sys

from absl import logging as absl_logging
import pytest

import trainer
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


def test_waiting_lines_are_never_held(capsys):
  with console.held() as release:
    console.info("optimizer | Adam")
    console.waiting("cluster | waiting for ps 0 at 10.0.0.4:2222 to answer")
    # Printed before the release; the held line still waits for it.
    assert capsys.readouterr().out == (
        "cluster | waiting for ps 0 at 10.0.0.4:2222 to answer\n")
    release(["run | header"])
  assert capsys.readouterr().out.splitlines() == [
      "run | header", "optimizer | Adam"]


@pytest.fixture
def status_line(monkeypatch):
  """A terminal 60 columns wide; the status line cleared after the test."""
  monkeypatch.setattr(console.shutil, "get_terminal_size",
                      lambda: os.terminal_size((60, 24)))
  yield
  monkeypatch.setattr(console, "_status", None)


def test_lines_print_above_the_status_line_which_is_drawn_again(
    capsys, caplog, absl_stream, status_line):
  del status_line
  absl_stream(io.StringIO())  # The log is a file: it gets the plain line.
  with caplog.at_level(logging.INFO, logger="absl"):
    console.status("step 10/20 [bar]", log="train | step 10/20")
    console.info("saved checkpoint run/ckpt-10")
    console.warning("slow")
    console.status("step 20/20 [bar]" + "x" * 80, log="train | step 20/20")
    console.end_status()
    console.info("eval | step 20")
  # Redrawn in place (erase the line, write it), cut to the width; every
  # other line above it.
  assert capsys.readouterr().out == (
      "\r\x1b[Kstep 10/20 [bar]"
      "\r\x1b[Ksaved checkpoint run/ckpt-10\nstep 10/20 [bar]"
      "\r\x1b[Kwarning | slow\nstep 10/20 [bar]"
      "\r\x1b[K" + ("step 20/20 [bar]" + "x" * 80)[:59] + "\n"
      "eval | step 20\n")
  assert [r.getMessage() for r in caplog.records] == [
      "train | step 10/20", "saved checkpoint run/ckpt-10", "slow",
      "train | step 20/20", "eval | step 20"]


def test_an_error_leaves_the_status_line_above_it(capsys, absl_stream,
                                                  status_line):
  del status_line
  absl_stream(sys.stderr)
  console.status("step 10/20")
  console.error("train.py: error: bad")
  captured = capsys.readouterr()
  assert captured.out == "\r\x1b[Kstep 10/20\n"
  assert captured.err == "train.py: error: bad\n"


def test_interactive_is_whether_stdout_is_a_terminal(monkeypatch):
  monkeypatch.setattr(sys, "stdout", io.StringIO())
  assert not console.interactive()


@pytest.mark.parametrize("stream", ["file", "terminal"])
def test_log_keeps_the_line_in_the_log_and_prints_nothing(
    capsys, caplog, absl_stream, stream):
  absl_stream(io.StringIO() if stream == "file" else sys.stderr)
  with caplog.at_level(logging.INFO, logger="absl"):
    console.log("wrote run/operative_config.gin")
  assert capsys.readouterr() == ("", "")
  assert [(r.levelno, r.getMessage(), r.filename) for r in caplog.records] == [
      (logging.INFO, "wrote run/operative_config.gin", "test_console.py")]


@pytest.fixture
def absl_verbosity():
  """Restores absl's verbosity after the test."""
  before = absl_logging.get_verbosity()
  yield
  absl_logging.set_verbosity(before)


def test_configure_keeps_info_out_of_the_log_unless_verbosity_asks(
    absl_verbosity, caplog):
  del absl_verbosity
  absl_logging.set_verbosity(absl_logging.DEBUG)
  console.configure(verbosity_asked=True)
  assert absl_logging.get_verbosity() == absl_logging.DEBUG
  console.configure(verbosity_asked=False)
  assert absl_logging.get_verbosity() == absl_logging.WARNING
  console.log("strategy OneDeviceStrategy with 1 replica(s); worker 0 of 1")
  absl_logging.warning("kept")
  assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
      (logging.WARNING, "kept")]


def test_configure_keeps_errors_only_where_a_script_asks(absl_verbosity):
  # A benchmark that prints only its table (scripts/benchmark_loss_check.py).
  del absl_verbosity
  console.configure(verbosity_asked=False, errors_only=True)
  assert absl_logging.get_verbosity() == absl_logging.ERROR


# absl's logging functions; only the channel and the TensorFlow-log plumbing
# may call them.
_ABSL_LOGGING_FUNCTIONS = {
    "debug", "info", "warning", "warn", "error", "fatal", "exception", "log",
    "vlog", "log_every_n", "log_every_n_seconds", "log_first_n", "log_if",
    "set_verbosity", "set_stderrthreshold"}
_CHANNEL_MODULES = {"console.py", "tf_logs.py"}


def _absl_logging_uses(source: str):
  """The `(line, name)` of each use of absl's logging functions in `source`,
  by `from absl import logging [as x]`, `import absl.logging [as x]` or
  `from absl.logging import f`."""
  tree = ast.parse(source)
  modules, functions, uses = set(), set(), []
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module == "absl":
      modules.update(a.asname or a.name for a in node.names
                     if a.name == "logging")
    elif isinstance(node, ast.ImportFrom) and node.module == "absl.logging":
      functions.update(a.asname or a.name for a in node.names
                       if a.name in _ABSL_LOGGING_FUNCTIONS)
    elif isinstance(node, ast.Import):
      modules.update(a.asname or a.name for a in node.names
                     if a.name == "absl.logging")
  for node in ast.walk(tree):
    if (isinstance(node, ast.Attribute) and
        node.attr in _ABSL_LOGGING_FUNCTIONS and
        ast.unparse(node.value) in modules):
      uses.append((node.lineno, ast.unparse(node)))
    elif isinstance(node, ast.Name) and node.id in functions:
      uses.append((node.lineno, node.id))
  return sorted(uses)


def test_the_scan_finds_each_way_of_calling_absl_logging():
  assert _absl_logging_uses(
      "from absl import logging\n"
      "import absl.logging\n"
      "from absl import logging as log\n"
      "from absl.logging import warning as warn\n"
      "from absl import flags\n"
      "import logging as std_logging\n"
      "logging.info('a')\n"
      "absl.logging.error('b')\n"
      "def f(w=log.warning): warn('c')\n"
      "std_logging.info('d')\n"
      "flags.DEFINE_string('e', None, 'e')\n") == [
          (7, "logging.info"), (8, "absl.logging.error"),
          (9, "log.warning"), (9, "warn")]


def test_only_the_channel_and_the_tensorflow_log_plumbing_call_absl_logging():
  package = pathlib.Path(trainer.__file__).parent
  found = {path.name: _absl_logging_uses(path.read_text())
           for path in sorted(package.rglob("*.py"))
           if path.name not in _CHANNEL_MODULES}
  assert len(found) > 30  # The whole package was read.
  assert {name: uses for name, uses in found.items() if uses} == {}
