"""tf.data service (`runtime.data_service`, scripts/data_service.py): a real
dispatcher and 2 worker processes on 127.0.0.1 produce digits' training
batches; a worker killed mid-run, a resumed run and the refusals."""

import os
import random
import re
import select
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf

import helpers
import trainer
from trainer.data import service as data_service

# Slow tests here that time a stall, a lost worker or a signal against a
# timeout, or restart a dispatcher on its port, are also marked `serial`:
# run alone (`.ci/run`'s serial stage). The others (a worker lost, a
# mixture, a trainer killed, the script's refusals) wait only under
# generous limits and run two at a time.

SCRIPT = "scripts/data_service.py"
TIMEOUT = 300


class _Server:
  """`python scripts/data_service.py ARGS`, started and serving."""

  def __init__(self, *args):
    self.process = subprocess.Popen(
        [sys.executable, SCRIPT, *args], cwd=helpers.REPO_ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    self.first_line = self.process.stdout.readline().strip()

  def stop(self, signum=signal.SIGTERM) -> int:
    """Stops it with `signum`; returns the exit code (None if it had to be
    killed after 30 s)."""
    if self.process.poll() is None:
      self.process.send_signal(signum)
    try:
      return self.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
      self.process.kill()
      self.process.wait()
      return None


def _line_matching(server: _Server, pattern: str, timeout: float = 60.0):
  """Reads `server`'s lines until one matches `pattern`; returns it."""
  deadline = time.monotonic() + timeout
  seen = []
  while time.monotonic() < deadline:
    ready, _, _ = select.select([server.process.stdout], [], [], 1.0)
    if ready:
      line = server.process.stdout.readline().strip()
      seen.append(line)
      if re.fullmatch(pattern, line):
        return line
  raise AssertionError(f"no line {pattern!r} in {timeout:g} s: {seen}")


@pytest.fixture(name="servers")
def fixture_servers():
  """A dispatcher and 2 workers; yields (address, dispatcher, [workers])."""
  ports = helpers.free_ports(3)
  dispatcher = _Server(f"--port={ports[0]}")
  workers = [_Server(f"--port={port}", f"--dispatcher=127.0.0.1:{ports[0]}",
                     "--host=127.0.0.1") for port in ports[1:]]
  try:
    assert dispatcher.first_line == (
        f"data_service | dispatcher serving at grpc://localhost:{ports[0]}")
    for worker, port in zip(workers, ports[1:]):
      assert worker.first_line == (
          f"data_service | worker serving at 127.0.0.1:{port} for "
          f"dispatcher 127.0.0.1:{ports[0]}")
    yield f"grpc://127.0.0.1:{ports[0]}", dispatcher, workers
  finally:
    codes = [server.stop() for server in workers + [dispatcher]]
  # Each stops on SIGTERM (exit 0; None: it had to be killed), a worker
  # that served a trainer included; -9 is a worker the test killed.
  assert all(code in (0, -signal.SIGKILL) for code in codes), codes


@pytest.fixture(name="service")
def fixture_service(servers):
  """A dispatcher and 2 workers; yields (address, [workers])."""
  address, _, workers = servers
  yield address, workers


@pytest.mark.slow
def test_digits_train_on_service_batches_and_survive_a_lost_worker(
    tmp_path, service):
  address, workers = service
  args = ["--gin_file=gin/digits.gin", "--model_dir=runs/digits",
          f"--gin_param=runtime.data_service=\"{address}\""]
  run = helpers.TrainProcess(args + ["--gin_param=trainer.train_steps=600"],
                             cwd=str(tmp_path))
  try:
    run.wait_for(rf"^input \| training batches from the tf.data service at "
                 rf"{address} \(distributed_epoch\)$")
    run.wait_for(r"^train \| step\s+200/600", timeout=TIMEOUT)
    # One of the two data workers dies mid-run; the other goes on.
    workers[0].process.kill()
    assert run.finish(timeout=TIMEOUT) == 0, run.lines[-20:]
  finally:
    run.close()
  out = "\n".join(run.lines)
  assert helpers.final_accuracy(out) >= 0.95, out[-2000:]
  assert helpers.checkpoint_step(str(tmp_path / "runs" / "digits")) == 600

  # Resumed: the service's position is not in the checkpoint.
  resumed = helpers.run_cli(args + ["--gin_param=trainer.train_steps=800"],
                            cwd=str(tmp_path), timeout=TIMEOUT)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert ("input | resuming: the training input starts again from its first "
          "batch (its position is not in the checkpoint)") in resumed.stdout
  assert helpers.final_accuracy(resumed.stdout) >= 0.95


@pytest.mark.slow
def test_the_shipped_mixture_trains_on_service_batches(tmp_path, service):
  address, _ = service
  result = helpers.run_cli(
      ["--gin_file=gin/digits_mixture.gin", "--model_dir=runs/mix",
       f"--gin_param=runtime.data_service=\"{address}\"",
       "--gin_param=trainer.train_steps=500"],
      cwd=str(tmp_path), timeout=TIMEOUT)
  assert result.returncode == 0, result.stderr[-3000:]
  assert ("mixture | clean 0.7, perturbed 0.3 (from `trainer.mixture`; a "
          "source that runs out starts over)") in result.stdout
  # The sources travel with the batches from the service's workers: the
  # shares of 32,000 examples are the rates', within 4 sigma.
  shares = helpers.read_scalars(str(tmp_path / "runs" / "mix" / "train"))
  clean = sum(value for _, value in shares["mixture/clean"]) / len(
      shares["mixture/clean"])
  assert abs(clean - 0.7) < 4 * (0.21 / 32000) ** 0.5, clean
  assert "final eval | clean/accuracy" in result.stdout


@pytest.mark.parametrize("settings, message", [
    (dict(data_service="grpc://127.0.0.1:5050", deterministic=True),
     "`runtime.deterministic` cannot be used with `runtime.data_service`: "
     "its workers hand out batches in the order they finish them, so no "
     "rerun or resumed run sees the same batches."),
    (dict(data_service="127.0.0.1"),
     "`runtime.data_service` ('127.0.0.1') must be the dispatcher's address, "
     "`grpc://host:port` (or `host:port`)."),
    (dict(data_service="127.0.0.1:5050",
          distribution_strategy="multi_worker_mirrored"),
     "`runtime.data_service` feeds a trainer that is one process (default, "
     "one_device, mirrored, central_storage), not 'multi_worker_mirrored'."),
    (dict(data_service="127.0.0.1:5050", data_service_mode="epochs"),
     "`runtime.data_service_mode` ('epochs') must be one of: "
     "distributed_epoch, parallel_epochs."),
    (dict(data_service_job_name="shared"),
     "`runtime.data_service_job_name` needs `runtime.data_service`."),
])
def test_settings_that_cannot_work_are_one_line(settings, message):
  with pytest.raises(trainer.ConfigError) as raised:
    data_service.check(trainer.RuntimeConfig(**settings))
  assert str(raised.value).splitlines()[0] == message


@pytest.mark.slow
def test_the_server_script_stops_on_sigterm_and_names_a_busy_port():
  no_port = subprocess.run([sys.executable, SCRIPT], cwd=helpers.REPO_ROOT,
                           capture_output=True, text=True, timeout=60)
  assert no_port.returncode == 2
  assert no_port.stderr.strip().splitlines()[-1] == (
      "data_service.py: error: flag --port=None: Flag --port must have a "
      "value other than None.")
  port = helpers.free_ports(1)[0]
  dispatcher = _Server(f"--port={port}")
  try:
    assert "dispatcher serving" in dispatcher.first_line
    busy = subprocess.run([sys.executable, SCRIPT, f"--port={port}"],
                          cwd=helpers.REPO_ROOT, capture_output=True,
                          text=True, timeout=60)
    assert busy.returncode == 1
    assert busy.stderr.strip().splitlines()[-1] == (
        f"data_service.py: error: port {port} is in use (Address already in "
        "use)")
  finally:
    assert dispatcher.stop() == 0
  assert dispatcher.process.stdout.read().strip() == "data_service | stopped"


@pytest.mark.slow
@pytest.mark.serial
def test_a_worker_waits_for_its_dispatcher_and_gives_up_in_one_line():
  dispatcher_port, worker_port = helpers.free_ports(2)
  # Started first, it waits, saying so, and serves once the dispatcher is up.
  worker = _Server(f"--port={worker_port}",
                   f"--dispatcher=localhost:{dispatcher_port}")
  assert worker.first_line == (
      f"data_service | waiting for dispatcher localhost:{dispatcher_port} "
      "(Connection refused)")
  dispatcher = _Server(f"--port={dispatcher_port}")
  try:
    assert worker.process.stdout.readline().strip() == (
        f"data_service | worker serving at localhost:{worker_port} for "
        f"dispatcher localhost:{dispatcher_port}")
    assert dispatcher.process.stdout.readline().strip() == (
        "data_service | dispatcher has 1 worker(s)")
  finally:
    assert worker.stop() == 0
    assert dispatcher.stop() == 0
  # None comes: one line when the wait is over (TensorFlow's worker would
  # wait an hour, deaf to SIGTERM).
  lonely = subprocess.run(
      [sys.executable, SCRIPT, f"--port={worker_port}",
       f"--dispatcher=localhost:{dispatcher_port}",
       "--wait_for_dispatcher=1"], cwd=helpers.REPO_ROOT,
      capture_output=True, text=True, timeout=60)
  assert lonely.returncode == 1
  assert lonely.stderr.strip().splitlines()[-1] == (
      f"data_service.py: error: no tf.data service dispatcher at "
      f"localhost:{dispatcher_port}: Connection refused for 1 s "
      "(--wait_for_dispatcher)")


def _restart_dispatcher_mid_run(tmp_path, *dispatcher_args):
  """Trains digits to 400 through a dispatcher that is killed and started
  again on its port at step 200; returns the finished run."""
  ports = helpers.free_ports(2)
  servers = [_Server(f"--port={ports[0]}", *dispatcher_args),
             _Server(f"--port={ports[1]}",
                     f"--dispatcher=127.0.0.1:{ports[0]}",
                     "--host=127.0.0.1")]
  run = helpers.TrainProcess(
      ["--gin_file=gin/digits.gin", "--model_dir=run",
       f"--gin_param=runtime.data_service=\"grpc://127.0.0.1:{ports[0]}\"",
       "--gin_param=trainer.train_steps=400",
       "--gin_param=trainer.checkpoint_interval=100",
       "--gin_param=trainer.validation_interval=400"], cwd=str(tmp_path))
  try:
    run.wait_for(r"^saved checkpoint run/ckpt-200", timeout=TIMEOUT)
    servers[0].process.kill()
    servers[0].process.wait()
    servers.append(_Server(f"--port={ports[0]}", *dispatcher_args))
    assert "dispatcher serving" in servers[-1].first_line
    run.finish(timeout=TIMEOUT)
  finally:
    run.close()
    for server in servers:
      server.stop()
  return run


@pytest.mark.slow
@pytest.mark.serial
def test_a_dispatcher_with_a_journal_is_restarted_and_training_goes_on(
    tmp_path):
  run = _restart_dispatcher_mid_run(tmp_path,
                                    f"--work_dir={tmp_path / 'journal'}")
  assert run.process.returncode == 0, run.lines[-20:]
  assert helpers.final_accuracy(run.output) >= 0.95
  assert helpers.checkpoint_step(str(tmp_path / "run")) == 400


_LOST_JOB = re.compile(
    r"^warning \| the tf\.data service lost this run's job at step (\d+) \(a "
    r"dispatcher restarted without `--work_dir` keeps none\): training goes "
    r"on with a new job, reading the input from its first batch$", re.M)


@pytest.mark.slow
@pytest.mark.serial
def test_a_dispatcher_without_a_journal_is_restarted_and_training_goes_on(
    tmp_path):
  run = _restart_dispatcher_mid_run(tmp_path)
  assert run.process.returncode == 0, run.lines[-20:]
  # Said once, at a step past the checkpoint the restart followed.
  lost = _LOST_JOB.findall(run.output)
  assert len(lost) == 1 and int(lost[0]) >= 200, run.output[-3000:]
  assert helpers.final_accuracy(run.output) >= 0.95
  assert helpers.checkpoint_step(str(tmp_path / "run")) == 400


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.parametrize("journal", [False, True], ids=["no_journal",
                                                        "journal"])
def test_one_rerun_resumes_after_the_trainer_and_the_dispatcher_died(
    tmp_path, journal):
  # Before, the first rerun after a dispatcher restart failed and only the
  # second resumed. (A new job may meet the lost job's task ids, which the
  # restarted dispatcher hands out again, and fail: the running trainer of
  # the test above meets that; then one more new job is read.) With a
  # journal the restarted dispatcher still has the dead run's job; the rerun
  # reads a new one.
  ports = helpers.free_ports(2)
  dispatcher = [f"--port={ports[0]}"] + (
      [f"--work_dir={tmp_path / 'journal'}"] if journal else [])
  servers = [_Server(*dispatcher),
             _Server(f"--port={ports[1]}",
                     f"--dispatcher=127.0.0.1:{ports[0]}",
                     "--host=127.0.0.1")]
  args = ["--gin_file=gin/digits.gin", "--model_dir=run",
          f"--gin_param=runtime.data_service=\"grpc://127.0.0.1:{ports[0]}\"",
          "--gin_param=trainer.train_steps=400",
          "--gin_param=trainer.checkpoint_interval=100",
          "--gin_param=trainer.validation_interval=400"]
  run = helpers.TrainProcess(args, cwd=str(tmp_path))
  try:
    run.wait_for(r"^saved checkpoint run/ckpt-200", timeout=TIMEOUT)
    run.process.kill()
    run.finish(timeout=TIMEOUT)
    servers[0].process.kill()
    servers[0].process.wait()
    servers.append(_Server(*dispatcher))
    assert "dispatcher serving" in servers[-1].first_line
    rerun = helpers.run_cli(args, cwd=str(tmp_path), timeout=TIMEOUT)
  finally:
    run.close()
    for server in servers:
      server.stop()
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  restored = re.search(r"^restored checkpoint run/ckpt-(\d+) at step",
                       rerun.stdout, re.M)
  assert restored and int(restored.group(1)) >= 200, rerun.stdout[-2000:]
  # The new job may meet the lost job's task ids a few steps in (and then
  # reads one more job): said once at most, past the restored step.
  lost = _LOST_JOB.findall(rerun.stdout)
  assert len(lost) <= 1 and all(
      int(step) >= int(restored.group(1)) for step in lost), rerun.stdout
  assert helpers.final_accuracy(rerun.stdout) >= 0.95
  assert helpers.checkpoint_step(str(tmp_path / "run")) == 400


def _lone_worker_run(tmp_path, *params):
  """A dispatcher, one worker and a digits run reading from them, past its
  checkpoint of step 100; returns (run, [dispatcher, worker], ports)."""
  ports = helpers.free_ports(3)
  servers = [_Server(f"--port={ports[0]}"),
             _Server(f"--port={ports[1]}",
                     f"--dispatcher=127.0.0.1:{ports[0]}",
                     "--host=127.0.0.1")]
  run = helpers.TrainProcess(
      ["--gin_file=gin/digits.gin", "--model_dir=run", "--mode=train",
       f"--gin_param=runtime.data_service=\"grpc://127.0.0.1:{ports[0]}\"",
       "--gin_param=trainer.checkpoint_interval=100", *params],
      cwd=str(tmp_path))
  try:
    run.wait_for(r"^saved checkpoint run/ckpt-100$", timeout=TIMEOUT)
  except BaseException:
    # The callers stop these only once it returns: a run that never got
    # there must not leave its servers behind for later tests.
    run.close()
    for server in servers:
      server.stop()
    raise
  return run, servers, ports


@pytest.mark.slow
@pytest.mark.serial
def test_no_batch_within_the_timeout_saves_the_step_and_exits_1(tmp_path):
  run, servers, ports = _lone_worker_run(
      tmp_path, "--gin_param=trainer.train_steps=100000",
      "--gin_param=runtime.data_service_timeout=10")
  try:
    servers[1].process.kill()  # The only worker.
    killed = time.time()
    returncode = run.finish(timeout=TIMEOUT)
  finally:
    run.close()
    for server in servers:
      server.stop()
  waited = time.time() - killed
  assert returncode == 1, run.stderr[-3000:]
  assert 10 <= waited < 60, waited
  last = run.stderr.strip().splitlines()[-1]
  found = re.fullmatch(
      r"train\.py: error: no batch from the tf\.data service for 1\d s at "
      r"step (\d+) \(`runtime\.data_service_timeout`\): the dispatcher at "
      rf"grpc://127\.0\.0\.1:{ports[0]} (has worker\(s\) 127\.0\.0\.1:"
      rf"{ports[1]}, which send none|has no worker; worker\(s\) last seen "
      rf"\d+ s ago: 127\.0\.0\.1:{ports[1]}); the checkpoint of step (\d+) "
      r"is saved; start workers \(python scripts/data_service\.py "
      rf"--port=PORT --dispatcher=127\.0\.0\.1:{ports[0]}\) and run the same "
      r"command again", last)
  assert found, last
  step = int(found.group(1))
  assert found.group(3) == found.group(1)
  # What the loop trained since the checkpoint of step 100 is kept.
  assert step > 100
  assert helpers.checkpoint_step(str(tmp_path / "run")) == step


def _wait_until_quiet(run: helpers.TrainProcess, seconds: float,
                     timeout: float = 60.0) -> None:
  """Returns once `run` has printed no line for `seconds` (a stalled loop
  prints none)."""
  deadline = time.monotonic() + timeout
  count, since = len(run.lines), time.monotonic()
  while time.monotonic() < deadline:
    time.sleep(0.2)
    if len(run.lines) != count:
      count, since = len(run.lines), time.monotonic()
    elif time.monotonic() - since >= seconds:
      return
  raise AssertionError(f"still printing after {timeout:g} s: "
                       f"{run.lines[-5:]}")


@pytest.mark.slow
@pytest.mark.serial
def test_sigterm_while_no_batch_comes_saves_the_step_reached_at_once(
    tmp_path):
  # The loop waits inside `next` on the service's iterator and never comes
  # back: the stall watch saves the step reached while it waits, as the
  # timeout does, instead of letting the grace period (25 s) run out.
  run, servers, ports = _lone_worker_run(
      tmp_path, "--gin_param=trainer.train_steps=100000")
  try:
    servers[1].process.kill()  # The only worker.
    servers[1].process.wait()
    _wait_until_quiet(run, 5.0)
    run.process.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    returncode = run.finish(timeout=TIMEOUT)
    took = time.monotonic() - signalled
  finally:
    run.close()
    for server in servers:
      server.stop()
  assert returncode == 42, run.stderr[-3000:]
  last = run.stderr.strip().splitlines()[-1]
  assert took < 10, f"{took:.1f} s: {last}"
  found = re.fullmatch(
      r"train\.py: error: preempted at step (\d+): no batch from the "
      r"tf\.data service for \d+ s \(the dispatcher at "
      rf"grpc://127\.0\.0\.1:{ports[0]} (has worker\(s\) 127\.0\.0\.1:"
      rf"{ports[1]}, which send none|has no worker; worker\(s\) last seen "
      rf"\d+ s ago: 127\.0\.0\.1:{ports[1]})\); the checkpoint of step "
      r"(\d+) was saved for SIGTERM; run the same command again to resume "
      r"from step (\d+) \(exit code 42\)", last)
  assert found, last
  step = int(found.group(1))
  assert found.group(3) == found.group(4) == found.group(1), last
  # What the loop trained since the checkpoint of step 100 is kept.
  assert step > 100, last
  model_dir = str(tmp_path / "run")
  assert tf.train.latest_checkpoint(model_dir) == os.path.join(
      model_dir, f"ckpt-{step}")
  assert helpers.checkpoint_step(model_dir) == step


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.parametrize("address", ["same", "new"])
def test_a_new_worker_lets_a_waiting_run_go_on(tmp_path, address):
  run, servers, ports = _lone_worker_run(
      tmp_path, "--gin_param=trainer.train_steps=300")
  port = ports[1] if address == "same" else ports[2]
  try:
    servers[1].process.kill()
    servers[1].process.wait()
    # The run waits: silent for 5 s, unfinished (a fixed 10 s sleep before).
    _wait_until_quiet(run, 5.0)
    assert run.process.poll() is None, run.lines[-5:]
    servers.append(_Server(f"--port={port}",
                           f"--dispatcher=127.0.0.1:{ports[0]}",
                           "--host=127.0.0.1"))
    returncode = run.finish(timeout=TIMEOUT)
  finally:
    run.close()
    for server in servers:
      server.stop()
  assert returncode == 0, run.stderr[-3000:]
  assert helpers.checkpoint_step(str(tmp_path / "run")) == 300


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_sigkill_at_a_random_moment_then_restart_resumes(tmp_path, service,
                                                          seed):
  # The random-kill campaign of test_resume.py on the service's path: its
  # batches come in no reproducible order, so the resumed run is checked
  # for its step and its accuracy, not bit for bit.
  address, _ = service
  args = ["--gin_file=gin/digits.gin", "--model_dir=run",
          f"--gin_param=runtime.data_service=\"{address}\"",
          "--gin_param=trainer.validation_interval=100000",
          "--gin_param=trainer.steps_per_loop=10",
          "--gin_param=trainer.summary_interval=10",
          "--gin_param=trainer.checkpoint_interval=20"]
  killed = helpers.TrainProcess(
      args + ["--gin_param=trainer.train_steps=100000"], cwd=str(tmp_path))
  try:
    killed.wait_for(r"^saved checkpoint run/ckpt-20$", timeout=TIMEOUT)
    time.sleep(random.Random(seed).uniform(0.0, 3.0))
    killed.process.kill()
  finally:
    killed.close()
  saved = helpers.checkpoint_step(str(tmp_path / "run"))
  assert saved >= 20
  resumed = helpers.run_cli(
      args + [f"--gin_param=trainer.train_steps={saved + 200}"],
      cwd=str(tmp_path), timeout=TIMEOUT)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert (f"restored checkpoint run/ckpt-{saved} at step {saved}" in
          resumed.stdout)
  assert helpers.checkpoint_step(str(tmp_path / "run")) == saved + 200
  assert helpers.final_accuracy(resumed.stdout) >= 0.95


@pytest.mark.slow
@pytest.mark.serial
def test_the_dispatcher_names_a_dead_worker_and_its_return(servers):
  # TensorFlow keeps a dead worker registered; the dispatcher's line says
  # nothing answers at its address, and says so no more once it is back.
  address, dispatcher, workers = servers
  dispatcher_port = address.rsplit(":", 1)[1]
  _line_matching(dispatcher, r"data_service \| dispatcher has 2 worker\(s\)")
  dead = workers[0].process.args[2].split("=")[1]
  workers[0].process.kill()
  workers[0].process.wait()
  _line_matching(dispatcher, (
      rf"data_service \| dispatcher has 2 worker\(s\), 1 unreachable: "
      rf"127.0.0.1:{dead} \(TensorFlow keeps a dead worker registered; "
      r"trainers read from the others\)"), timeout=30)
  workers.append(_Server(f"--port={dead}",
                         f"--dispatcher=127.0.0.1:{dispatcher_port}",
                         "--host=127.0.0.1"))
  _line_matching(dispatcher, r"data_service \| dispatcher has 2 worker\(s\)",
                 timeout=30)
