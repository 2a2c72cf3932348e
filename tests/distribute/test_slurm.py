"""trainer.slurm, and training under a real SLURM.

The parsers are checked against `scontrol show hostnames` where SLURM is
installed. The jobs run on a one-node cluster that `scripts/local_slurm.sh`
starts for this module (munged, slurmctld and slurmd, all in a temporary
directory; root only): `srun` and `sbatch` with the shipped
`scripts/slurm/train.sbatch`, `scontrol requeue`, and a time limit with
SIGUSR1. Where the cluster cannot start (not root, SLURM not installed), those
tests are skipped with the reason; `.ci/run` installs SLURM where it can.
"""

import os
import random
import re
import shutil
import subprocess
import sys
import time

import pytest

import helpers
from trainer import errors
from trainer.distribute import slurm
from trainer.storage import worker_inputs

# One local SLURM cluster at a time; KillWait and requeues are timed: run
# alone (`.ci/run`'s serial stage).
pytestmark = pytest.mark.serial

SBATCH_SCRIPT = os.path.join(helpers.REPO_ROOT, "scripts", "slurm",
                             "train.sbatch")
MWMS = '--gin_param=runtime.distribution_strategy="multi_worker_mirrored"'
# One configuration for every deterministic run compared below.
DIGITS = ["--gin_file=gin/digits.gin", "--gin_param=runtime.deterministic=True",
          "--mode=train"]
# Long enough that a job under a 1-minute limit is still training when
# SLURM's time-limit signal comes (slurmctld checks limits on a cycle, so
# it may come well after the `--signal` time): 3000 steps finished in 25 s
# here once, before it came.
LONG_STEPS = 6000

# (host list, what `scontrol show hostnames` prints), recorded from SLURM
# 22.05 and checked against it again where it is installed.
HOSTLISTS = [
    ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
    ("vm", ["vm"]),
    ("a,b", ["a", "b"]),
    ("a b", ["a", "b"]),
    ("a,,b", ["a", "b"]),
    ("n[1-2],m5,o[3-4,6,7-9]",
     ["n1", "n2", "m5", "o3", "o4", "o6", "o7", "o8", "o9"]),
    ("rack[1-2]-node[01-02]",
     ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"]),
    ("node[1-2][3-4]", ["node13", "node14", "node23", "node24"]),
    ("node[9-11]", ["node9", "node10", "node11"]),
    ("node[009-011]", ["node009", "node010", "node011"]),
    ("n[01-3]", ["n01", "n02", "n03"]),
    ("n[1-03]", ["n1", "n2", "n3"]),
    ("gpu-a[1,3]", ["gpu-a1", "gpu-a3"]),
    ("node[1-2],node1", ["node1", "node2", "node1"]),
    ("n[2-2]", ["n2"]),
]
# Lists SLURM refuses ("Invalid hostlist"), and what this parser says.
BAD_HOSTLISTS = [
    ("n[1-3]x", "text after the last bracket in 'n[1-3]x'"),
    ("node[3-1]", "range '3-1' in 'node[3-1]' goes down"),
    ("node[]", "range '' in 'node[]' is not N or N-M"),
    ("node[a-b]", "range 'a-b' in 'node[a-b]' is not N or N-M"),
    ("n[1-2,]", "range '' in 'n[1-2,]' is not N or N-M"),
    ("n[1--2]", "range '1--2' in 'n[1--2]' is not N or N-M"),
]


@pytest.mark.parametrize("hostlist, hosts", HOSTLISTS)
def test_expand_hostlist(hostlist, hosts):
  assert slurm.expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize("hostlist, message", BAD_HOSTLISTS + [
    ("node[1-2", "unbalanced brackets in 'node[1-2'"),
    ("node]1", "unbalanced brackets in 'node]1'"),
    ("n[[1]]", "unbalanced brackets in 'n[[1]]'"),
    ("", "no host in it"),
])
def test_expand_hostlist_refuses_what_slurm_does_not_write(hostlist, message):
  with pytest.raises(ValueError) as error:
    slurm.expand_hostlist(hostlist)
  assert str(error.value) == message


def _scontrol_hostnames(tmp_path, hostlist):
  conf = tmp_path / "slurm.conf"
  conf.write_text("ClusterName=x\nSlurmctldHost=localhost\n"
                  "NodeName=localhost\nPartitionName=p Nodes=localhost\n")
  result = subprocess.run(["scontrol", "show", "hostnames", hostlist],
                          env=dict(os.environ, SLURM_CONF=str(conf)),
                          capture_output=True, text=True, timeout=30,
                          check=True)
  return result.stdout.split(), result.stderr + result.stdout


@pytest.mark.skipif(shutil.which("scontrol") is None,
                    reason="scontrol not installed (apt-get install "
                    "slurm-client)")
def test_the_host_lists_are_scontrols(tmp_path):
  for hostlist, hosts in HOSTLISTS:
    assert _scontrol_hostnames(tmp_path, hostlist)[0] == hosts, hostlist
  for hostlist, _ in BAD_HOSTLISTS:
    assert "Invalid hostlist" in _scontrol_hostnames(tmp_path, hostlist)[1]


@pytest.mark.parametrize("text, counts", [
    ("2", [2]), ("2(x3),1", [2, 2, 2, 1]), ("1,4(x2)", [1, 4, 4]),
])
def test_expand_tasks_per_node(text, counts):
  assert slurm.expand_tasks_per_node(text) == counts


@pytest.mark.parametrize("text", ["", "2(x)", "x", "2(x0)", "2,"])
def test_expand_tasks_per_node_refuses_the_rest(text):
  with pytest.raises(ValueError, match="is not N or N\\(xM\\)"):
    slurm.expand_tasks_per_node(text)


def _step(proc_id=0, node="n1", local_id=0, hosts=("n1", "n2"),
          tasks=(2, 2)):
  return slurm.Step(job_id="7", step_id="0", nodelist="n[1-2]", hosts=hosts,
                    tasks_per_node=tasks, node=node, local_id=local_id,
                    proc_id=proc_id)


def test_a_task_finds_its_place_from_its_node_and_local_id():
  # `srun --distribution=cyclic` puts rank 1 on the second node: its slot
  # is there, whatever its rank (TensorFlow's resolver would give it n1's).
  step = _step(proc_id=1, node="n2", local_id=0)
  assert step.index == 2
  assert step.addresses(100)[step.index] == "n2:100"
  assert step.addresses(100) == ["n1:100", "n1:101", "n2:100", "n2:101"]


@pytest.mark.parametrize("num_ps, evaluator, roles", [
    (1, False, [("chief", 0), ("ps", 0), ("worker", 0), ("worker", 1)]),
    (2, False, [("chief", 0), ("ps", 0), ("ps", 1), ("worker", 0)]),
    (1, True, [("chief", 0), ("ps", 0), ("worker", 0), ("evaluator", 0)]),
])
def test_parameter_server_roles(num_ps, evaluator, roles):
  found = []
  for index in range(4):
    step = _step(node="n1" if index < 2 else "n2", local_id=index % 2)
    spec, task_type, task_index = slurm.cluster(
        step, "parameter_server", 100, num_ps, evaluator)
    found.append((task_type, task_index))
  assert found == roles
  assert sum(len(members) for members in spec.values()) == 4 - evaluator


@pytest.mark.parametrize("visible, local_tasks, local_id, env, share", [
    (0, 2, 1, {}, None),  # No GPUs: nothing to split.
    (4, 1, 0, {}, None),  # One task per node: all of them.
    (4, 2, 1, {}, [2, 3]),
    (2, 2, 0, {}, [0]),
    (1, 2, 1, {"SLURM_GPUS_PER_TASK": "1"}, None),  # SLURM bound them.
])
def test_gpus_for_task(visible, local_tasks, local_id, env, share):
  step = _step(local_id=local_id, hosts=("n1",), tasks=(local_tasks,))
  assert slurm.gpus_for_task(visible, step, env) == share


def test_gpus_that_do_not_split_are_one_line():
  step = _step(local_id=0, hosts=("n1",), tasks=(3,))
  with pytest.raises(errors.ConfigError,
                     match=r"^3 SLURM tasks on n1 share 4 GPU\(s\), which do "
                     r"not split evenly between them: ask for one GPU per "
                     r"task \(srun --gpus-per-task=1\)"):
    slurm.gpus_for_task(4, step, {})


def test_requeue_outcome_outside_slurm_and_off_the_chief():
  assert slurm.requeue_outcome(True, {}) == (
      "not in a SLURM job, so nothing to requeue: run the same command again")
  assert slurm.requeue_outcome(False, {"SLURM_JOB_ID": "5"}) == (
      "the chief requeues SLURM job 5")



def test_an_array_task_is_named_and_requeued_as_itself():
  # SLURM_JOB_ID 7 is the array's own id here: `scontrol requeue 7` would
  # requeue every task of the array.
  task = {"SLURM_JOB_ID": "7", "SLURM_ARRAY_JOB_ID": "7",
          "SLURM_ARRAY_TASK_ID": "1"}
  assert slurm.job_name(task) == "7_1"
  assert slurm.job_id(task) == "7"
  assert slurm.job_name({"SLURM_JOB_ID": "5"}) == "5"
  assert slurm.job_name({}) is None
  assert slurm.requeue_outcome(False, task) == (
      "the chief requeues SLURM job 7_1")

# A real cluster from here on: `slurm_env` (tests/conftest.py).


def _srun(env, tasks, args, cwd, timeout=300, prefix=()):
  """`srun -n{tasks} -l --kill-on-bad-exit=1 python train.py ARGS`; -l
  labels every line with its task (`0: ...`)."""
  return subprocess.run(
      ["srun", f"-n{tasks}", "-l", "--kill-on-bad-exit=1", *prefix,
       sys.executable, helpers.TRAIN_PY, *args],
      cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _task_lines(output, task):
  return [line.split(": ", 1)[1] for line in output.splitlines()
          if line.startswith(f"{task}: ")]


def _fingerprints(text):
  return re.findall(r"weights fingerprint (\w+)", text)


def _job(env, job_id, fields="%T %r"):
  """squeue's `STATE REASON` of the job, or '' once it has left the queue.

  A squeue that fails (slurmctld busy or restarting) prints nothing as well:
  it is asked again, never taken for a job that has ended."""
  for _ in range(30):
    listed = subprocess.run(["squeue", "-h", "-j", job_id, "-o", fields],
                            env=env, capture_output=True, text=True,
                            timeout=30)
    if listed.returncode == 0:
      return listed.stdout.strip()
    time.sleep(1)
  raise AssertionError(f"squeue failed 30 times: {listed.stderr}")


def _final_state(env, job_id):
  """`JobState=... ExitCode=...` of a job, from `scontrol show job` (slurmctld
  keeps a finished job MinJobAge, 300 s), for an assertion's message."""
  shown = subprocess.run(["scontrol", "show", "job", job_id], env=env,
                         capture_output=True, text=True, timeout=30)
  return " ".join(re.findall(r"\b(?:JobState|Reason|ExitCode)=\S+",
                             shown.stdout)) or shown.stderr.strip()


def _sbatch(env, output, *args, options=()):
  """Submits the shipped sbatch script from the repository's root, as its
  header says; returns the job id."""
  submitted = subprocess.run(
      ["sbatch", "--parsable", f"--output={output}", *options, SBATCH_SCRIPT,
       *args], cwd=helpers.REPO_ROOT, env=env, capture_output=True, text=True,
      timeout=60, check=True)
  return submitted.stdout.strip().split(";")[0]


def _release_until_done(env, job_id, timeout):
  """Waits for the job to leave the queue, starting it again each time a
  requeue left it pending for its begin time; returns the number of
  releases.

  SLURM holds a requeued job back for the credential lifetime (120 s)
  because a requeue revokes the job's credentials, to the second: a job
  started again within the second of its requeue is killed at once (`Job
  credential revoked` in slurmctld's log, the batch script never runs).
  So the release waits 2 s, not the whole lifetime."""
  deadline, releases = time.time() + timeout, 0
  while True:
    state = _job(env, job_id)
    if not state:
      return releases
    assert time.time() < deadline, f"job {job_id} still {state}"
    if state == "PENDING BeginTime":
      time.sleep(2)
      subprocess.run(["scontrol", "update", f"jobid={job_id}",
                      "StartTime=now"], env=env, check=True, timeout=30)
      releases += 1
    time.sleep(0.5)


@pytest.mark.slow
def test_srun_forms_the_cluster_and_matches_worker_hosts(slurm_env, tmp_path):
  # From the user's own directory, with a relative --model_dir.
  # train_and_eval, for the evaluation's accuracy.
  digits = [arg for arg in DIGITS if arg != "--mode=train"]
  result = _srun(slurm_env, 2, [*digits, MWMS, "--model_dir=runs/slurm",
                                "--gin_param=trainer.train_steps=300"],
                 cwd=tmp_path)
  assert result.returncode == 0, result.stderr[-3000:]
  host = _hostname()
  job = re.search(r"SLURM job (\d+) step", result.stdout).group(1)
  for task in (0, 1):
    assert (f"cluster | SLURM job {job} step 0: 2 workers on {host}, this is "
            f"worker {task}") in _task_lines(result.stdout, task)
    assert (f"input | worker {task} reads input pipeline {task} of 2"
            in _task_lines(result.stdout, task))
  slurm_prints = _fingerprints(result.stdout)
  assert len(slurm_prints) == 2 and slurm_prints[0] == slurm_prints[1]

  model_dir = tmp_path / "runs" / "slurm"
  accuracy = helpers.read_scalars(str(model_dir / "eval"))["accuracy"][-1]
  assert accuracy[0] == 300 and accuracy[1] >= 0.95
  # Only the chief wrote into model_dir, beside each task's own input
  # position of the step saved.
  assert sorted(os.listdir(model_dir)) == [
      "checkpoint", "ckpt-300.data-00000-of-00001", "ckpt-300.index", "eval",
      "input", "metrics.csv", "operative_config.gin", "train"]
  assert sorted(os.listdir(model_dir / "input" / "workers-2")) == [
      "worker-0", "worker-1"]
  for task in (0, 1):
    assert worker_inputs.saved_steps(str(
        model_dir / "input" / "workers-2" / f"worker-{task}")) == [300]
  # metrics.csv is the chief's alone: one row a summary, none twice.
  rows = (model_dir / "metrics.csv").read_text().splitlines()[1:]
  step_and_split = [(row.split(",")[0], row.split(",")[2]) for row in rows]
  assert rows and len(set(step_and_split)) == len(step_and_split)
  assert len(os.listdir(model_dir / "train")) == 1

  # The same run with the cluster given by hand, outside SLURM: the same
  # weights, bit for bit (deterministic ops and input).
  hosts = ",".join(f"127.0.0.1:{port}" for port in helpers.free_ports(2))
  env = {name: value for name, value in os.environ.items()
         if not name.startswith("SLURM")}
  env.pop("TF_CONFIG", None)
  workers = [subprocess.Popen(
      [sys.executable, helpers.TRAIN_PY, *digits, MWMS,
       f'--gin_param=runtime.worker_hosts="{hosts}"',
       f"--gin_param=runtime.task_index={index}",
       "--gin_param=trainer.train_steps=300", "--model_dir=runs/hosts"],
      cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True) for index in range(2)]
  for returncode, stdout, stderr in helpers.finish(workers, timeout=300):
    assert returncode == 0, stderr[-3000:]
    assert _fingerprints(stdout) == [slurm_prints[0]]


@pytest.fixture(scope="module")
def requeued(slurm_env, tmp_path_factory):
  """A job of the shipped sbatch script that `scontrol requeue` stopped as
  soon as its training started, and that ran again to LONG_STEPS: its
  job id, model_dir, output and the step it stopped at."""
  tmp_path = tmp_path_factory.mktemp("requeued")
  output = tmp_path / "job.out"
  model_dir = tmp_path / "run"
  job = _sbatch(slurm_env, output, *DIGITS, f"--model_dir={model_dir}",
                f"--gin_param=trainer.train_steps={LONG_STEPS}")
  deadline = time.time() + 240
  while not (model_dir / "operative_config.gin").exists():
    assert time.time() < deadline and _job(slurm_env, job), (
        output.read_text() if output.exists() else "no output")
    time.sleep(0.5)
  subprocess.run(["scontrol", "requeue", job], env=slurm_env, check=True,
                 timeout=30)
  requeued_at = time.time()
  # Every task gets SIGTERM, saves and exits; the job waits for its begin
  # time, which the test brings forward.
  releases = _release_until_done(slurm_env, job, timeout=300)
  text = output.read_text()
  stops = re.findall(r"train.py: error: preempted at step (\d+): "
                     r"checkpoint saved; run the same command again to "
                     r"resume \(exit code 42\)", text)
  assert releases == 1 and len(stops) == 2 and stops[0] == stops[1], (
      f"{_final_state(slurm_env, job)}\n{text[-3000:]}")
  assert time.time() - requeued_at < 300
  return job, model_dir, text, int(stops[0])


@pytest.mark.slow
def test_a_requeued_job_resumes_where_it_stopped(requeued):
  job, model_dir, text, step = requeued
  assert 0 < step < LONG_STEPS
  assert f"restored checkpoint {model_dir}/ckpt-{step} at step {step}" in text
  assert f"job {job} run 2 on " in text
  # Each task continues from its own input position of that step.
  for index in range(2):
    assert (f"input | resuming: worker {index} continues from its position "
            f"of step {step} ") in text, text[-3000:]
  assert "skips the" not in text
  # Both tasks end with the same weights.
  fingerprints = _fingerprints(text)
  assert len(fingerprints) == 2 and len(set(fingerprints)) == 1, text[-3000:]


@pytest.mark.slow
@pytest.mark.serial  # The one local cluster.
def test_a_job_killed_with_sigkill_resumes_from_each_tasks_position(
    slurm_env, tmp_path):
  """`scancel --signal=KILL` at a moment after a save: the job run again
  restores each task's own input position (no batch read again) and ends
  with the weights of a job never killed, bit for bit."""
  args = [*DIGITS, "--gin_param=trainer.train_steps=1500",
          "--gin_param=trainer.checkpoint_interval=100"]
  model_dir = tmp_path / "run"
  job = _sbatch(slurm_env, tmp_path / "killed.out", *args,
                f"--model_dir={model_dir}")
  deadline = time.time() + 240
  while not (model_dir / "ckpt-200.index").exists():
    assert time.time() < deadline and _job(slurm_env, job), (
        _final_state(slurm_env, job))
    time.sleep(0.2)
  time.sleep(random.uniform(0, 1.5))  # Anywhere in the next loops.
  subprocess.run(["scancel", "--signal=KILL", "--full", job], env=slurm_env,
                 check=True, timeout=30)
  _release_until_done(slurm_env, job, timeout=120)
  saved = helpers.checkpoint_step(str(model_dir))
  assert 200 <= saved < 1500, _final_state(slurm_env, job)

  again = tmp_path / "again.out"
  job = _sbatch(slurm_env, again, *args, f"--model_dir={model_dir}")
  _release_until_done(slurm_env, job, timeout=300)
  text = again.read_text()
  for index in range(2):
    assert (f"input | resuming: worker {index} continues from its position "
            f"of step {saved} ") in text, text[-3000:]
  assert "skips the" not in text

  straight = tmp_path / "straight.out"
  job = _sbatch(slurm_env, straight, *args,
                f"--model_dir={tmp_path / 'straight'}")
  _release_until_done(slurm_env, job, timeout=300)
  ended = _fingerprints(text)
  assert len(ended) == 2 and len(set(ended)) == 1, text[-3000:]
  assert _fingerprints(straight.read_text()) == ended


@pytest.mark.slow
def test_the_time_limit_warning_checkpoints_and_requeues(slurm_env, requeued,
                                                         tmp_path):
  output = tmp_path / "job.out"
  model_dir = tmp_path / "run"
  # SIGUSR1 45 s before a 1-minute limit (SLURM may send it earlier).
  job = _sbatch(slurm_env, output, *DIGITS, f"--model_dir={model_dir}",
                f"--gin_param=trainer.train_steps={LONG_STEPS}",
                options=["--time=1", "--signal=USR1@45"])
  releases = _release_until_done(slurm_env, job, timeout=480)
  text = output.read_text()
  chief_stops = re.findall(
      r"train.py: error: preempted at step (\d+) by SIGUSR1 \(the time limit "
      rf"is near\): checkpoint saved; SLURM job {job} requeued, to resume "
      r"from step \1 \(exit code 42\)", text)
  other_stops = re.findall(
      r"preempted at step (\d+) by SIGUSR1 \(the time limit is near\): "
      rf"checkpoint saved; the chief requeues SLURM job {job}, to resume",
      text)
  assert releases >= 1 and len(chief_stops) == releases, text[-3000:]
  assert other_stops == chief_stops  # Both tasks stopped at the same step.
  assert "DUE TO TIME LIMIT" not in text
  # Stopped where the requeued job did not (a stop comes at the end of a
  # loop: both may stop at the first), it ends with its weights, bit for
  # bit: where a run stops does not change where it ends. (Against a run
  # never stopped: tests/distribute/test_multiworker.py.)
  requeued_step, requeued_text = requeued[3], requeued[2]
  assert set(chief_stops) - {str(requeued_step)}, (chief_stops, requeued_step)
  assert _fingerprints(text) == _fingerprints(requeued_text), (
      f"{_final_state(slurm_env, job)}\n{text[-3000:]}")


@pytest.mark.parametrize("tasks, args, prefix, message", [
    (1, [MWMS], (),
     r"'multi_worker_mirrored' in SLURM job \d+ step 0, which has one task "
     r"\(srun -n1\): there is no other worker\."),
    # Two srun tasks each (~9 s): with the slow tests, one at a time on the
    # one local cluster; tests/distribute/test_cluster.py checks both
    # messages in-process.
    pytest.param(
        2, [MWMS, '--gin_param=runtime.worker_hosts="a:1,a:2,a:3"',
            "--gin_param=runtime.task_index=0"], (),
        r"`runtime.worker_hosts` names 3 worker\(s\), but SLURM job \d+ step "
        r"0 has 2 tasks \(srun -n2\): leave it unset under srun and the "
        r"cluster comes from SLURM\.",
        marks=[pytest.mark.slow, pytest.mark.serial]),
    pytest.param(
        2, [MWMS], ("env", "SLURM_STEP_NODELIST=vm[1-"),
        r"SLURM_STEP_NODELIST \('vm\[1-'\) cannot be parsed: unbalanced "
        r"brackets in 'vm\[1-'\.",
        marks=[pytest.mark.slow, pytest.mark.serial]),
])
def test_bad_input_under_srun_is_one_line_and_writes_nothing(
    slurm_env, tmp_path, tasks, args, prefix, message):
  # `env` runs between srun and python, so a variable can be made wrong.
  # No --kill-on-bad-exit: every task must reach its own line (with it,
  # the first task's exit ended the other before it did, under load).
  result = subprocess.run(
      ["srun", f"-n{tasks}", "-l", *prefix,
       sys.executable, helpers.TRAIN_PY, "--gin_file=gin/digits.gin",
       "--model_dir=run", *args],
      cwd=tmp_path, env=slurm_env, capture_output=True, text=True,
      timeout=300)
  assert result.returncode == 2, result.stderr[-3000:]
  for task in range(tasks):
    last = _task_lines(result.stderr, task)[-1]
    assert re.match(r"train.py: error: " + message, last), last
  assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_task_with_the_wrong_task_index_stops_the_step(slurm_env, tmp_path):
  # srun gives both tasks `task_index=0`: task 1 says so, and
  # --kill-on-bad-exit ends task 0, which would wait for its peer.
  result = _srun(slurm_env, 2, [
      "--gin_file=gin/digits.gin", MWMS, "--model_dir=run",
      '--gin_param=runtime.worker_hosts="127.0.0.1:1,127.0.0.1:2"',
      "--gin_param=runtime.task_index=0"], cwd=tmp_path, timeout=300)
  assert result.returncode != 0
  job = re.search(r"SLURM job (\d+)", result.stderr).group(1)
  assert _task_lines(result.stderr, 1)[-1] == (
      "train.py: error: `runtime.worker_hosts` makes this task worker 0, but "
      f"it is SLURM task 1 (SLURM_PROCID) of SLURM job {job} step 0: srun "
      "gives every task the same arguments and environment; leave it unset "
      "under srun and the cluster comes from SLURM.")
  assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_srun_splits_a_step_into_parameter_server_roles(slurm_env, tmp_path):
  # 5 tasks on 2 CPUs (--overcommit): chief, 1 ps, 2 workers, evaluator.
  result = _srun(slurm_env, 5, [
      "--gin_file=gin/digits.gin", "--model_dir=run", "--mode=train",
      '--gin_param=runtime.distribution_strategy="parameter_server"',
      "--gin_param=runtime.num_ps=1", "--gin_param=runtime.evaluator_task=True",
      "--gin_param=trainer.train_steps=300"], cwd=tmp_path,
                 prefix=("--overcommit",))
  assert result.returncode == 0, result.stderr[-3000:]
  roles = ["chief 0", "ps 0", "worker 0", "worker 1",
           "the evaluator (outside the cluster)"]
  for task, role in enumerate(roles):
    lines = _task_lines(result.stdout, task)
    assert any(line.startswith("cluster | SLURM job ") and
               line.endswith(f"1 chief, 2 workers, 1 ps on "
                             f"{_hostname()}, this is {role}")
               for line in lines), (task, lines)
  assert "train | finished at step 300" in result.stdout
  # The evaluator task evaluated the chief's last checkpoint...
  evaluator = _task_lines(result.stdout, 4)
  assert "restored checkpoint run/ckpt-300 at step 300" in evaluator
  accuracy = helpers.read_scalars(str(tmp_path / "run" / "eval"))["accuracy"]
  assert accuracy[-1][0] == 300 and accuracy[-1][1] >= 0.9
  # ...and the servers stopped once the chief was gone, ending the step.
  for task, name in [(1, "ps 0"), (2, "worker 0"), (3, "worker 1")]:
    assert any(line.startswith("server | the chief at ") and
               line.endswith(f"is gone: {name} stops")
               for line in _task_lines(result.stdout, task))


def _hostname():
  return subprocess.run(["hostname", "-s"], capture_output=True, text=True,
                        check=True).stdout.strip()


@pytest.mark.slow
def test_a_grace_period_past_killwait_is_said_at_start(slurm_env, tmp_path):
  # The local cluster keeps SLURM's default KillWait, 30 s.
  result = _srun(slurm_env, 1, [
      "--gin_file=gin/digits.gin", "--model_dir=run", "--dry_run",
      "--gin_param=trainer.preemption_grace_seconds=40"], cwd=tmp_path)
  assert result.returncode == 0, result.stderr[-3000:]
  assert _task_lines(result.stdout, 0)[0] == (
      "warning | `trainer.preemption_grace_seconds` (40 s) is not below "
      "SLURM's KillWait (30 s): its SIGKILL may cut the checkpoint a "
      "SIGTERM asks for; set it a few seconds lower.")
  assert "KillWait" not in _srun(
      slurm_env, 1, ["--gin_file=gin/digits.gin", "--model_dir=run",
                     "--dry_run"], cwd=tmp_path).stdout
