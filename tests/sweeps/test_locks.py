"""trainer/sweeps/locks.py on a URL sweep directory: the locks are local;
one process sweeps it, and says so at the URL."""

import os
import socket
import subprocess
import sys
import time

import pytest

from trainer import errors
from trainer.storage import files
from trainer.storage import lease
from trainer.sweeps import locks
from trainer.sweeps import warm


def test_a_url_sweeps_locks_are_in_its_local_folder(url_sweep_dir):
  local = warm.local_dir(url_sweep_dir)
  assert not files.is_url(local)
  assert locks.claims(url_sweep_dir) == os.path.join(local, locks.CLAIMS)
  assert locks.trial(url_sweep_dir, "trial-3") == os.path.join(
      local, "trial-3", locks.TRIAL)
  fd = locks.try_lock(locks.trial(url_sweep_dir, "trial-3"))
  assert locks.try_lock(locks.trial(url_sweep_dir, "trial-3")) is None
  locks.release(fd)
  with locks.held(locks.claims(url_sweep_dir)):
    pass
  assert not files.exists(url_sweep_dir)  # Nothing at the URL.
  # No trainer's lease object there: nothing to wait for.
  assert locks.wait_for_trainer(url_sweep_dir + "/trial-3", timeout=0)


def test_a_url_trial_is_waited_for_while_its_trainer_runs_here(
    url_sweep_dir):
  """A killed sweep's trial (SIGTERM from its parent's death) may still be
  saving: its lease object names it, and its rerun waits while it runs."""
  model_dir = url_sweep_dir + "/trial-0"
  saving = subprocess.Popen([sys.executable, "-c", "import time; "
                             "time.sleep(30)"])
  try:
    files.write_json(lease.lock_path(model_dir, lease.TRAINER), {
        "host": socket.gethostname(), "pid": saving.pid, "token": "x"})
    assert not locks.wait_for_trainer(model_dir, timeout=0.3,
                                      poll_seconds=0.05)
  finally:
    saving.kill()
    saving.wait()
  # Ended (killed, its object left): free.
  assert locks.wait_for_trainer(model_dir, timeout=0)
  # Elsewhere: it cannot be asked; not waited for.
  files.write_json(lease.lock_path(model_dir, lease.TRAINER), {
      "host": "node-7", "pid": os.getpid(), "token": "x"})
  assert locks.wait_for_trainer(model_dir, timeout=0)


def test_a_local_sweep_has_its_locks_in_it(tmp_path):
  sweep_dir = str(tmp_path)
  assert locks.claims(sweep_dir) == os.path.join(sweep_dir, locks.CLAIMS)
  assert locks.trial(sweep_dir, "trial-0") == os.path.join(
      sweep_dir, "trial-0", locks.TRIAL)
  with locks.alone(sweep_dir), locks.alone(sweep_dir):  # Shared.
    pass
  assert not os.listdir(tmp_path)


def _refusal(sweep_dir, who):
  return (f"--sweep_dir={sweep_dir} is swept by {who}: sweep processes "
          "cannot share a URL --sweep_dir (each keeps its journal and locks "
          "on its own machine); for several workers give a --sweep_dir on a "
          "shared file system (NFS) that every worker mounts.")


def test_one_process_sweeps_a_url_and_says_so_there(url_sweep_dir):
  owner = os.path.join(url_sweep_dir, locks.OWNER)
  with locks.alone(url_sweep_dir, heartbeat_seconds=0.05):
    first = files.read_json(owner)
    assert (first["pid"], sorted(first)) == (
        os.getpid(), ["beat", "host", "pid", "token"])
    with pytest.raises(errors.ConfigError) as raised:
      with locks.alone(url_sweep_dir):
        pass
    assert str(raised.value) == _refusal(url_sweep_dir,
                                         "another process on this machine")
    time.sleep(0.3)
    assert files.read_json(owner)["beat"] > first["beat"]  # Its heartbeat.
  assert not files.exists(owner)


def _record(host, pid, age, token="x"):
  return {"host": host, "pid": pid, "token": token,
          "beat": time.time() - age}


def test_a_process_elsewhere_that_beats_again_is_refused(url_sweep_dir,
                                                         monkeypatch):
  owner = os.path.join(url_sweep_dir, locks.OWNER)
  files.write_json(owner, _record("node-7", 12, 5))
  waited = []

  def sleep(seconds):  # Its heartbeat comes while this process waits.
    waited.append(seconds)
    files.write_json(owner, _record("node-7", 12, 0))

  monkeypatch.setattr(locks.time, "sleep", sleep)
  with pytest.raises(errors.ConfigError) as raised:
    with locks.alone(url_sweep_dir, heartbeat_seconds=30):
      pass
  assert str(raised.value) == _refusal(
      url_sweep_dir, "pid 12 on host node-7 (its heartbeat came 0 s ago)")
  assert waited == [5.0]  # Polled every 5 s at most.
  assert files.read_json(owner)["host"] == "node-7"  # Left as it was.


def test_a_silent_process_elsewhere_is_waited_out_then_taken_over(
    url_sweep_dir, capsys):
  """Killed (SIGKILL) on another pod: its rescheduled successor waits until
  its heartbeat is `stale_seconds` old, then continues its sweep."""
  owner = os.path.join(url_sweep_dir, locks.OWNER)
  files.write_json(owner, _record("node-7", 12, 0.2))
  started = time.time()
  with locks.alone(url_sweep_dir, stale_seconds=1.0):
    assert 0.7 < time.time() - started < 3
    assert files.read_json(owner)["pid"] == os.getpid()
  assert not files.exists(owner)
  assert (f"sweep | {owner}: pid 12 on host node-7 was seen 0 s ago; "
          "waiting up to 1 s for its next heartbeat (none: it is gone and "
          "this process continues its sweep)") in capsys.readouterr().out
  # Two minutes old: taken over at once.
  files.write_json(owner, _record("node-7", 12, 121))
  started = time.time()
  with locks.alone(url_sweep_dir):
    assert files.read_json(owner)["pid"] == os.getpid()
  assert time.time() - started < 1


def test_a_gone_process_of_this_host_is_taken_over_at_once(url_sweep_dir,
                                                           capsys):
  owner = os.path.join(url_sweep_dir, locks.OWNER)
  gone = _dead_pid()
  files.write_json(owner, _record(socket.gethostname(), gone, 1))
  with locks.alone(url_sweep_dir):
    assert files.read_json(owner)["pid"] == os.getpid()
  assert (f"sweep | {owner}: pid {gone} of this host is gone: this process "
          "continues its sweep") in capsys.readouterr().out
  # A running one of this host (another HOME's local folder, its flock
  # unseen) is waited for like one elsewhere.
  files.write_json(owner, _record(socket.gethostname(), os.getpid(), 0.2))
  with locks.alone(url_sweep_dir, stale_seconds=1.0):
    pass
  assert "waiting up to 1 s for its next heartbeat" in (
      capsys.readouterr().out)


def _dead_pid():
  """The pid of a process that has ended (and been reaped)."""
  process = subprocess.Popen(["true"])
  process.wait()
  return process.pid


def test_a_process_taken_for_dead_leaves_its_successor_be(url_sweep_dir):
  owner = os.path.join(url_sweep_dir, locks.OWNER)
  with locks.alone(url_sweep_dir):
    # Its heartbeat was late (a network partition): another took over.
    files.write_json(owner, {"host": "node-7", "pid": 12, "token": "x",
                             "beat": time.time()})
  assert files.read_json(owner)["token"] == "x"
