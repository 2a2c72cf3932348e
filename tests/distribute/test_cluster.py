"""trainer.cluster: where a multi-process run's cluster comes from.

TF_CONFIG as Kubernetes operators and cloud services write it, a SLURM step's
environment (set here as `srun` sets it; tests/distribute/test_slurm.py runs
real `srun`), `runtime.worker_hosts`, and each against the others.
"""

import json
import socket

import pytest

from trainer import console
from trainer import errors
from trainer import runtime as runtime_lib
from trainer.distribute import cluster
from trainer.distribute import roles
from trainer.distribute import slurm
from trainer.distribute import strategy as strategy_lib

MWMS = "multi_worker_mirrored"


@pytest.fixture(autouse=True)
def clean_cluster(monkeypatch):
  """No TF_CONFIG or SLURM variables from outside."""
  monkeypatch.delenv("TF_CONFIG", raising=False)
  for name in list(__import__("os").environ):
    if name.startswith("SLURM"):
      monkeypatch.delenv(name)


def _srun_env(monkeypatch, proc_id, num_tasks=2, nodelist="vm",
              tasks_per_node="2", node="vm", local_id=None, job="17"):
  """The variables `srun -n{num_tasks}` gives task `proc_id`."""
  values = {
      "SLURM_JOB_ID": job, "SLURM_STEP_ID": "0",
      "SLURM_STEP_NUM_TASKS": str(num_tasks), "SLURM_NTASKS": str(num_tasks),
      "SLURM_STEP_NODELIST": nodelist,
      "SLURM_STEP_TASKS_PER_NODE": tasks_per_node, "SLURMD_NODENAME": node,
      "SLURM_LOCALID": str(proc_id if local_id is None else local_id),
      "SLURM_PROCID": str(proc_id)}
  for name, value in values.items():
    monkeypatch.setenv(name, value)


def _tf_config():
  return json.loads(__import__("os").environ["TF_CONFIG"])


def test_a_slurm_step_becomes_the_cluster_of_every_task(monkeypatch, capsys):
  _srun_env(monkeypatch, proc_id=1, job="17")
  membership = cluster.configure(
      runtime_lib.RuntimeConfig(distribution_strategy=MWMS))
  base = 15000 + 16 * 17
  assert _tf_config() == {
      "cluster": {"worker": [f"vm:{base}", f"vm:{base + 1}"]},
      "task": {"type": "worker", "index": 1}}
  assert capsys.readouterr().out == (
      "cluster | SLURM job 17 step 0: 2 workers on vm, this is worker 1\n")
  # What the rest of the process needs to know is in the answer.
  assert membership.from_slurm and membership.slurm_step.job_id == "17"


def test_several_nodes_get_one_address_per_task_and_a_port_base(monkeypatch):
  # Task 4 of `srun -N3 -n5` with node[01-02,07] and 2(x2),1: the first
  # task of node02 under block distribution... and whatever SLURM_PROCID
  # says, its place is node02's first slot.
  _srun_env(monkeypatch, proc_id=2, num_tasks=5, nodelist="node[01-02,07]",
            tasks_per_node="2(x2),1", node="node02", local_id=0)
  cluster.configure(runtime_lib.RuntimeConfig(distribution_strategy=MWMS,
                                              port_base=20000))
  assert _tf_config() == {
      "cluster": {"worker": ["node01:20000", "node01:20001", "node02:20000",
                             "node02:20001", "node07:20000"]},
      "task": {"type": "worker", "index": 2}}


def test_parameter_server_split_of_a_step(monkeypatch, capsys):
  for proc_id, task in [(0, ("chief", 0)), (1, ("ps", 0)),
                        (2, ("worker", 0)), (3, ("worker", 1)),
                        (4, ("evaluator", 0))]:
    monkeypatch.delenv("TF_CONFIG", raising=False)
    _srun_env(monkeypatch, proc_id, num_tasks=5, tasks_per_node="5")
    membership = cluster.configure(runtime_lib.RuntimeConfig(
        distribution_strategy="parameter_server", num_ps=1,
        evaluator_task=True, port_base=20000))
    config = _tf_config()
    assert config["cluster"] == {
        "chief": ["vm:20000"], "ps": ["vm:20001"],
        "worker": ["vm:20002", "vm:20003"]}
    assert (config["task"]["type"], config["task"]["index"]) == task
  assert capsys.readouterr().out.splitlines()[-1] == (
      "cluster | SLURM job 17 step 0: 1 chief, 2 workers, 1 ps on vm, this "
      "is the evaluator (outside the cluster)")
  # Under srun every task has the same --mode: the evaluator evaluates.
  runtime, mode = roles.evaluator_role(
      runtime_lib.RuntimeConfig(distribution_strategy="parameter_server"),
      "train", membership)
  assert (runtime.distribution_strategy, mode) == ("default",
                                                   "continuous_eval")


@pytest.mark.parametrize("env, settings, message", [
    (dict(num_tasks=1, tasks_per_node="1", proc_id=0),
     dict(distribution_strategy=MWMS),
     r"^'multi_worker_mirrored' in SLURM job 17 step 0, which has one task "
     r"\(srun -n1\): there is no other worker\. Start one task per worker "),
    ({}, dict(distribution_strategy=MWMS,
              worker_hosts="h:1,h:2,h:3", task_index=1),
     r"^`runtime.worker_hosts` names 3 worker\(s\), but SLURM job 17 step 0 "
     r"has 2 tasks \(srun -n2\): leave it unset under srun "),
    ({}, dict(distribution_strategy=MWMS, worker_hosts="h:1,h:2",
              task_index=0),
     r"^`runtime.worker_hosts` makes this task worker 0, but it is SLURM "
     r"task 1 \(SLURM_PROCID\) of SLURM job 17 step 0: srun gives every "),
    (dict(nodelist="vm[1-"), dict(distribution_strategy=MWMS),
     r"^SLURM_STEP_NODELIST \('vm\[1-'\) cannot be parsed: unbalanced "
     r"brackets in 'vm\[1-'\.$"),
    (dict(tasks_per_node="2(x)"), dict(distribution_strategy=MWMS),
     r"^SLURM_STEP_TASKS_PER_NODE \('2\(x\)'\) cannot be parsed: '2\(x\)' "
     r"is not N or N\(xM\)\.$"),
    (dict(node="other"), dict(distribution_strategy=MWMS),
     r"^this node, SLURMD_NODENAME \('other'\), is not in "
     r"SLURM_STEP_NODELIST \('vm'\)\.$"),
    (dict(num_tasks=3, tasks_per_node="3"),
     dict(distribution_strategy="parameter_server", num_ps=2),
     r"^'parameter_server' with `runtime.num_ps`=2 needs at least 4 SLURM "
     r"tasks \(a chief, the ps, a worker\); SLURM job 17 step 0 has 3 "),
    ({}, dict(distribution_strategy="parameter_server"),
     r"^'parameter_server' in SLURM job 17 step 0 needs `runtime.num_ps`"),
])
def test_slurm_mistakes_are_one_line(monkeypatch, env, settings, message):
  _srun_env(monkeypatch, **{"proc_id": 1, "tasks_per_node": "2", **env})
  with pytest.raises(errors.ConfigError, match=message):
    cluster.configure(runtime_lib.RuntimeConfig(**settings))
  assert "TF_CONFIG" not in __import__("os").environ


def test_a_tf_config_exported_before_srun_is_refused_in_the_other_task(
    monkeypatch):
  # srun copies the submitting shell's environment into every task.
  _srun_env(monkeypatch, proc_id=1)
  monkeypatch.setenv("TF_CONFIG", json.dumps({
      "cluster": {"worker": ["vm:1", "vm:2"]},
      "task": {"type": "worker", "index": 0}}))
  with pytest.raises(errors.ConfigError,
                     match=r"^TF_CONFIG makes this task worker 0, but it is "
                     r"SLURM task 1 \(SLURM_PROCID\)"):
    cluster.configure(runtime_lib.RuntimeConfig(distribution_strategy=MWMS))


def test_the_batch_script_itself_is_not_a_cluster(monkeypatch):
  # `python train.py` straight in a `#SBATCH -n 2` script: SLURM runs the
  # script once; only srun starts the tasks (no SLURM_STEP_* there).
  monkeypatch.setenv("SLURM_JOB_ID", "9")
  monkeypatch.setenv("SLURM_NTASKS", "2")
  with pytest.raises(errors.ConfigError,
                     match=r"^'multi_worker_mirrored' in the batch script of "
                     r"SLURM job 9, which SLURM runs once for the 2 tasks it "
                     r"asked for: start the command with srun"):
    cluster.configure(runtime_lib.RuntimeConfig(distribution_strategy=MWMS))


def test_a_port_in_use_is_named(monkeypatch):
  with socket.socket() as busy:
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    _srun_env(monkeypatch, proc_id=0)
    with pytest.raises(errors.ConfigError,
                       match=rf"^port {port} on vm \(`runtime.port_base` "
                       rf"{port} \+ local task 0\) is in use \(.*\): set "
                       r"`runtime.port_base` to the start of a free range\.$"):
      cluster.configure(runtime_lib.RuntimeConfig(
          distribution_strategy=MWMS, port_base=port))


def test_single_process_strategies_form_no_cluster(monkeypatch, capsys):
  _srun_env(monkeypatch, proc_id=1, nodelist="vm[1-")  # Not theirs to parse.
  cluster.configure(runtime_lib.RuntimeConfig(distribution_strategy="mirrored"))
  assert "TF_CONFIG" not in __import__("os").environ
  assert capsys.readouterr().out == ""
  # Under `srun -n2` each task would train alone: said once, at start.
  _srun_env(monkeypatch, proc_id=1)
  config = runtime_lib.RuntimeConfig(distribution_strategy="mirrored")
  membership = strategy_lib.set_up(config)
  assert capsys.readouterr().out == (
      "warning | SLURM job 17 step 0 runs this command in 2 tasks, and "
      "'mirrored' trains in one process: each task trains on its own. For "
      "one run over all of them use 'multi_worker_mirrored'; for one run "
      "here, srun -n1.\n")
  # Once: the strategy is built for the process as it was set up.
  strategy_lib.create_strategy(config, membership)
  assert capsys.readouterr().out == ""


# TF_CONFIG as it is written by (verbatim shapes, our host names):
# - the Kubeflow training operator (pkg/controller.v1/tensorflow): every
#   replica type in `cluster`, the evaluator too, and "environment": "cloud";
# - Vertex AI / AI Platform: the evaluator outside `cluster`, plus "job"
#   and "environment" keys;
# - a bare MultiWorkerMirrored job: workers only.
KUBEFLOW_PS = {
    "cluster": {"chief": ["job-chief-0.ns.svc:2222"],
                "evaluator": ["job-evaluator-0.ns.svc:2222"],
                "ps": ["job-ps-0.ns.svc:2222"],
                "worker": ["job-worker-0.ns.svc:2222",
                           "job-worker-1.ns.svc:2222"]},
    "environment": "cloud"}
VERTEX_PS = {
    "cluster": {"chief": ["cmle-training-workerpool0-ab-0:2222"],
                "worker": ["cmle-training-workerpool1-ab-0:2222",
                           "cmle-training-workerpool1-ab-1:2222"],
                "ps": ["cmle-training-workerpool2-ab-0:2222"]},
    "environment": "cloud", "job": {"python_module": "train"}}
KUBEFLOW_MWMS = {
    "cluster": {"chief": ["job-chief-0.ns.svc:2222"],
                "worker": ["job-worker-0.ns.svc:2222",
                           "job-worker-1.ns.svc:2222"]},
    "environment": "cloud"}
WORKERS_ONLY = {"cluster": {"worker": ["a:1", "b:1", "c:1"]}}


@pytest.mark.parametrize("shape, task, role, position", [
    (KUBEFLOW_PS, ("chief", 0), ("chief", 0), None),
    (KUBEFLOW_PS, ("worker", 1), ("worker", 1), None),
    (KUBEFLOW_PS, ("ps", 0), ("ps", 0), None),
    (KUBEFLOW_PS, ("evaluator", 0), ("evaluator", 0), None),
    (VERTEX_PS, ("chief", 0), ("chief", 0), None),
    (VERTEX_PS, ("ps", 0), ("ps", 0), None),
    (VERTEX_PS, ("evaluator", 0), ("evaluator", 0), None),
    (KUBEFLOW_MWMS, ("chief", 0), ("chief", 0), (3, 0, True)),
    (KUBEFLOW_MWMS, ("worker", 1), ("worker", 1), (3, 2, False)),
    (WORKERS_ONLY, ("worker", 0), ("worker", 0), (3, 0, True)),
    (WORKERS_ONLY, ("worker", 2), ("worker", 2), (3, 2, False)),
])
def test_tf_config_shapes_of_operators_and_services_are_read_as_they_are(
    monkeypatch, capsys, shape, task, role, position):
  config = dict(shape, task={"type": task[0], "index": task[1]})
  monkeypatch.setenv("TF_CONFIG", json.dumps(config))
  strategy = "parameter_server" if "ps" in shape["cluster"] else MWMS
  membership = cluster.configure(
      runtime_lib.RuntimeConfig(distribution_strategy=strategy))
  assert json.loads(__import__("os").environ["TF_CONFIG"]) == config
  assert roles.task_role() == role
  line = capsys.readouterr().out
  assert line.startswith("cluster | TF_CONFIG: ")
  if position is not None:
    info = cluster.worker_position(shape["cluster"], *task)
    assert (info.num_workers, info.worker_index, info.is_chief) == position
  if task[0] == "evaluator":
    runtime, mode = roles.evaluator_role(
        runtime_lib.RuntimeConfig(distribution_strategy=strategy),
        "continuous_eval", membership)
    assert (runtime.distribution_strategy, mode) == ("default",
                                                     "continuous_eval")
    with pytest.raises(errors.ConfigError, match="^the evaluator task runs"):
      roles.evaluator_role(runtime, "train", membership)  # Not under srun.


@pytest.mark.parametrize("config, message", [
    # SageMaker's parameter-server setup names its first host `master`.
    ({"cluster": {"master": ["algo-1:2222"], "ps": ["algo-1:2223"],
                  "worker": ["algo-2:2222"]},
      "environment": "cloud", "task": {"index": 0, "type": "master"}},
     r"^TF_CONFIG names a `master` task, which tf.distribute refuses "
     r"\(\"Disallowed task type\"\): name it `chief`\.$"),
    # Kubeflow with EnableDynamicWorker.
    ({"sparseCluster": {"worker": {"1": "job-worker-1.ns.svc:2222"},
                        "ps": ["job-ps-0.ns.svc:2222"]},
      "task": {"type": "worker", "index": 1}},
     r"^TF_CONFIG has a `sparseCluster` \(Kubeflow's EnableDynamicWorker\)"),
    ({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 3}},
     r"^TF_CONFIG task .* does not name a member of its cluster"),
])
def test_tf_config_shapes_tf_distribute_cannot_run_are_one_line(
    monkeypatch, config, message):
  monkeypatch.setenv("TF_CONFIG", json.dumps(config))
  with pytest.raises(errors.ConfigError, match=message):
    cluster.configure(runtime_lib.RuntimeConfig(distribution_strategy=MWMS))


def test_the_default_port_rule_gives_every_task_of_a_job_the_same_base():
  step = slurm.Step(job_id="123456", step_id="0", nodelist="vm",
                    hosts=("vm",), tasks_per_node=(2,), node="vm",
                    local_id=1, proc_id=1)
  assert slurm.port_base(step, None) == 15000 + 16 * 456
  assert slurm.port_base(step, 30000) == 30000


class _Clock:
  """A clock that moves only when slept on."""

  def __init__(self):
    self.now = 100.0

  def __call__(self):
    return self.now

  def sleep(self, seconds):
    self.now += seconds


def test_the_chief_says_which_tasks_it_waits_for_then_gives_up(capsys):
  clock = _Clock()
  tasks = {"ps 0": "10.0.0.4:2222", "worker 0": "10.0.0.2:2222"}
  probe = lambda address: (None if address == "10.0.0.2:2222"
                           else "Connection refused")
  with pytest.raises(errors.RunError) as raised:
    cluster.wait_for_tasks(tasks, 65, probe_fn=probe, clock=clock,
                           sleep=clock.sleep)
  waiting = ("cluster | waiting for ps 0 at 10.0.0.4:2222 (Connection "
             "refused) to answer ({} s; the chief gives up after 65 s, "
             "`runtime.cluster_wait_timeout`)\n")
  assert capsys.readouterr().out == waiting.format(3) + waiting.format(33) + (
      waiting.format(63))
  assert str(raised.value) == (
      "ps 0 at 10.0.0.4:2222 (Connection refused) did not answer within 65 s "
      "(`runtime.cluster_wait_timeout`): start it with its command, or "
      "correct its address in TF_CONFIG; nothing was trained or written")
  assert clock.now == 165.0


def test_tasks_that_answer_late_end_the_wait_with_a_line(capsys):
  clock = _Clock()
  tasks = {"ps 0": "10.0.0.4:2222", "worker 0": "10.0.0.2:2222"}
  probe = lambda address: "Connection refused" if clock.now < 105 else None
  cluster.wait_for_tasks(tasks, None, probe_fn=probe, clock=clock,
                         sleep=clock.sleep)
  assert capsys.readouterr().out == (
      "cluster | waiting for ps 0 at 10.0.0.4:2222 (Connection refused), "
      "worker 0 at 10.0.0.2:2222 (Connection refused) to answer (3 s)\n"
      "cluster | every task answers (after 5 s)\n")
  # Tasks that answer at once: not a word.
  cluster.wait_for_tasks(tasks, 1, probe_fn=lambda address: None,
                         clock=clock, sleep=clock.sleep)
  assert capsys.readouterr().out == ""


def test_the_wait_is_said_while_the_build_holds_its_lines(capsys):
  # The chief waits inside `console.held()` (experiment builds the strategy
  # there): each line must show while it waits, not with the final error.
  clock = _Clock()
  seen = []

  def sleep(seconds):
    seen.append(capsys.readouterr().out)
    clock.sleep(seconds)

  probe = lambda address: "Connection refused" if clock.now < 104 else None
  with console.held():
    console.info("optimizer | Adam")
    cluster.wait_for_tasks({"ps 0": "10.0.0.4:2222"}, 300, probe_fn=probe,
                           clock=clock, sleep=sleep)
    assert "".join(seen) + capsys.readouterr().out == (
        "cluster | waiting for ps 0 at 10.0.0.4:2222 (Connection refused) to "
        "answer (3 s; the chief gives up after 300 s, "
        "`runtime.cluster_wait_timeout`)\n"
        "cluster | every task answers (after 4 s)\n")
  # Printed during the sleep that followed it (the 7th), not later.
  assert seen.index(next(text for text in seen if text)) == 6
  assert capsys.readouterr().out == "optimizer | Adam\n"


def test_a_probe_says_why_nothing_answers():
  with socket.socket() as listening:
    listening.bind(("127.0.0.1", 0))
    listening.listen()
    address = f"127.0.0.1:{listening.getsockname()[1]}"
    assert cluster.probe(address) is None
  assert cluster.probe(address) == "Connection refused"
