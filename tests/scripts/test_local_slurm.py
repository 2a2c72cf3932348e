"""scripts/local_slurm.sh: `stop` leaves no process of a job behind.

A job step outlives slurmd (slurmstepd is a process of its own) and a task
that ignores SIGTERM outlives a cancel. Left running, it keeps its job's
ports, which the next cluster's job of the same id asks for: that is how
two SLURM tests once found `port 15016 ... in use`.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

import helpers

LOCAL_SLURM = os.path.join(helpers.REPO_ROOT, "scripts", "local_slurm.sh")

pytestmark = [
    pytest.mark.slow,
    # Times a cancel against SLURM's KillWait; starts a cluster of its own
    # (free ports), so it may run beside the `slurm` lane.
    pytest.mark.serial,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("slurmctld") is None,
        reason="the local SLURM cluster needs root and slurm-wlm, munge"),
]

# A task that ignores SIGTERM (as a trainer in its grace period does) and
# holds a port until it is killed.
_HOLDER = ("import signal, socket, sys, time\n"
           "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
           "s = socket.socket()\n"
           "s.bind(('127.0.0.1', int(sys.argv[1])))\n"
           "s.listen()\n"
           "print('listening', flush=True)\n"
           "time.sleep(600)\n")


def _local_slurm(action, directory):
  return subprocess.run(["bash", LOCAL_SLURM, action, str(directory)],
                        capture_output=True, text=True, timeout=120)


def _port_free(port):
  with socket.socket() as probe:
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      probe.bind(("127.0.0.1", port))
    except OSError:
      return False
  return True


@pytest.fixture
def cluster(tmp_path):
  """A cluster of its own, started; stopped again at the end whatever the
  test left (`stop` on a stopped cluster does nothing)."""
  directory = tmp_path / "cluster"
  started = _local_slurm("start", directory)
  assert started.returncode == 0, started.stderr
  yield directory
  _local_slurm("stop", directory)


def _start_holder(directory, tmp_path):
  """Submits a batch job whose task holds a free port; returns the port
  once the task listens."""
  env = dict(os.environ, SLURM_CONF=str(directory / "slurm.conf"))
  port = helpers.free_ports(1)[0]
  script = tmp_path / "holder.py"
  script.write_text(_HOLDER)
  output = tmp_path / "job.out"
  subprocess.run(["sbatch", f"--output={output}", "--wrap",
                  f"exec {sys.executable} {script} {port}"],
                 env=env, check=True, capture_output=True, timeout=60)
  deadline = time.time() + 60
  while not (output.exists() and "listening" in output.read_text()):
    assert time.time() < deadline, "the job never started"
    time.sleep(0.2)
  assert not _port_free(port)
  return port


def _holders(script):
  listed = subprocess.run(["pgrep", "-f", str(script)], capture_output=True,
                          text=True)
  return listed.stdout.split()


def test_stop_waits_for_a_cancelled_task_that_ignores_sigterm(cluster,
                                                              tmp_path):
  port = _start_holder(cluster, tmp_path)
  stopped = _local_slurm("stop", cluster)
  assert stopped.returncode == 0, stopped.stderr
  # SLURM killed it after KillWait: nothing was left for `stop` to kill.
  assert "killed" not in stopped.stderr
  assert _holders(tmp_path / "holder.py") == []
  assert _port_free(port)


def test_stop_kills_the_job_steps_a_dead_controller_left(cluster, tmp_path):
  port = _start_holder(cluster, tmp_path)
  with open(cluster / "run" / "slurmctld.pid") as f:
    os.kill(int(f.read()), signal.SIGKILL)  # No cancel reaches the job.
  stopped = _local_slurm("stop", cluster)
  assert stopped.returncode == 0, stopped.stderr
  assert "of jobs still running at stop" in stopped.stderr
  assert _holders(tmp_path / "holder.py") == []
  assert _port_free(port)
