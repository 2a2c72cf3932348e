"""SLURM: a job step's cluster read from its environment, and requeueing.

Under `srun`, every task of a step runs the same command; SLURM tells each
one the step's nodes (`SLURM_STEP_NODELIST`, a compressed host list such as
`node[01-03,07]`), how many tasks run on each (`SLURM_STEP_TASKS_PER_NODE`,
e.g. `2(x3),1`), which node it is on (`SLURMD_NODENAME`) and its place on
that node (`SLURM_LOCALID`). From these alone, every task computes the same
cluster: the nodes in SLURM's order, each with one address per task on it
(`port_base + local id`), and its own index in that list. Under SLURM's
default block distribution that index is `SLURM_PROCID`.

Written here rather than taken from TensorFlow's `SlurmClusterResolver`
(TF 2.20), which cannot be made right on the clusters users have:
- on a CPU node it fails whatever it is given: without arguments it runs
  `nvidia-smi` (`FileNotFoundError`), with `gpus_per_node=0` it divides the
  node's GPUs by zero (`ValueError: range() arg 3 must not be zero`), and
  with made-up GPU counts it reports `{'GPU': 1}` on a node without GPUs;
- it gives rank r the r-th address in host order, which is the node rank r
  runs on only under block distribution (`srun --distribution=cyclic` puts
  rank 1 on the second node, and the resolver on the first);
- it sorts the task types by name, so an evaluator lands inside the cluster
  (TensorFlow wants the sidecar evaluator outside it), and every job on a
  node shares its one fixed `port_base` (8888).
Its host-list grammar is SLURM's (multi-dimensional brackets included) and
`tests/distribute/test_slurm.py` checks this parser against
`scontrol show hostnames`.
"""

import dataclasses
import os
import re
import subprocess
from typing import Dict, List, Mapping, Optional, Tuple

from trainer import errors

# Ports: `DEFAULT_PORT_BASE + 16 * (job id % 1000)` + the task's local id,
# so jobs sharing a node get different ports (15000-30999: below Linux's
# ephemeral range, 32768 and up). A requeued job keeps its id and its ports.
DEFAULT_PORT_BASE = 15000
PORTS_PER_JOB = 16
MAX_PORT = 65535

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_TASKS = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def expand_hostlist(hostlist: str) -> List[str]:
  """Expands a SLURM host list, as `scontrol show hostnames` does.

  `node[01-03,07]` -> node01, node02, node03, node07 (numbers keep the width
  of a range's first number); `rack[1-2]-n[1-2]` -> rack1-n1, rack1-n2,
  rack2-n1, rack2-n2; entries are separated by commas or spaces; order and
  repeats are kept.

  Raises:
    ValueError: For a list SLURM would not write (unbalanced brackets, an
      empty or descending range, text after the last bracket).
  """
  hosts = []
  for entry in _split_entries(hostlist):
    parts = re.split(r"(\[[^\[\]]*\])", entry)
    # `re.split` with a group alternates text and brackets: t0 [b0] t1 ...
    texts, brackets = parts[0::2], parts[1::2]
    if any("[" in text or "]" in text for text in texts):
      raise ValueError(f"unbalanced brackets in {entry!r}")
    if brackets and texts[-1]:
      # SLURM refuses `n[1-3]x` (though it takes `n[1-2]x[3]`).
      raise ValueError(f"text after the last bracket in {entry!r}")
    expanded = [texts[0]]
    for bracket, text in zip(brackets, texts[1:]):
      numbers = _expand_ranges(bracket[1:-1], entry)
      expanded = [host + number + text for host in expanded
                  for number in numbers]
    hosts.extend(expanded)
  if not hosts:
    raise ValueError("no host in it")
  return hosts


def _split_entries(hostlist: str) -> List[str]:
  """Splits at commas and spaces outside brackets; drops empty entries."""
  entries, current, depth = [], "", 0
  for char in hostlist:
    depth += {"[": 1, "]": -1}.get(char, 0)
    if depth < 0 or depth > 1:
      raise ValueError(f"unbalanced brackets in {hostlist!r}")
    if depth == 0 and (char == "," or char.isspace()):
      entries.append(current)
      current = ""
    else:
      current += char
  if depth:
    raise ValueError(f"unbalanced brackets in {hostlist!r}")
  entries.append(current)
  return [entry for entry in entries if entry]


def _expand_ranges(ranges: str, entry: str) -> List[str]:
  """`01-03,7` -> 01, 02, 03, 7."""
  numbers = []
  for part in ranges.split(","):
    match = _RANGE.match(part)
    if not match:
      raise ValueError(f"range {part!r} in {entry!r} is not N or N-M")
    first, last = match.group(1), match.group(2) or match.group(1)
    if int(last) < int(first):
      raise ValueError(f"range {part!r} in {entry!r} goes down")
    numbers.extend(str(n).zfill(len(first))
                   for n in range(int(first), int(last) + 1))
  return numbers


def expand_tasks_per_node(tasks_per_node: str) -> List[int]:
  """Expands SLURM's tasks-per-node string: `2(x3),1` -> [2, 2, 2, 1].

  Raises:
    ValueError: For anything else.
  """
  counts = []
  for part in tasks_per_node.split(","):
    match = _TASKS.match(part.strip())
    if not match or int(match.group(2) or 1) < 1:
      raise ValueError(f"{part!r} is not N or N(xM)")
    counts.extend([int(match.group(1))] * int(match.group(2) or 1))
  return counts


@dataclasses.dataclass(frozen=True)
class Step:
  """The SLURM job step this process is a task of, from its environment.

  Attributes:
    job_id: `SLURM_JOB_ID`.
    step_id: `SLURM_STEP_ID`.
    nodelist: The step's nodes as SLURM writes them (`node[01-02]`).
    hosts: The step's nodes, expanded, in SLURM's order.
    tasks_per_node: Tasks on each of `hosts`.
    node: The node this task runs on (`SLURMD_NODENAME`).
    local_id: This task's place among the tasks on its node.
    proc_id: `SLURM_PROCID`, this task's rank in the step.
  """
  job_id: str
  step_id: str
  nodelist: str
  hosts: Tuple[str, ...]
  tasks_per_node: Tuple[int, ...]
  node: str
  local_id: int
  proc_id: int

  @property
  def num_tasks(self) -> int:
    """Tasks in the step."""
    return sum(self.tasks_per_node)

  @property
  def index(self) -> int:
    """This task's place in the step's node list order: the tasks of the
    nodes before its own, plus its local id."""
    position = self.hosts.index(self.node)
    return sum(self.tasks_per_node[:position]) + self.local_id

  @property
  def local_tasks(self) -> int:
    """Tasks of the step on this task's node."""
    return self.tasks_per_node[self.hosts.index(self.node)]

  def addresses(self, port_base: int) -> List[str]:
    """`host:port` of every task, in index order."""
    return [f"{host}:{port_base + local}"
            for host, count in zip(self.hosts, self.tasks_per_node)
            for local in range(count)]

  def describe(self) -> str:
    """E.g. `SLURM job 17 step 0`."""
    return f"SLURM job {self.job_id} step {self.step_id}"


def job_id(environ: Mapping[str, str] = os.environ) -> Optional[str]:
  """This process's SLURM job id, or None outside a SLURM job."""
  return environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID") or None


def job_name(environ: Mapping[str, str] = os.environ) -> Optional[str]:
  """This job as `squeue` and `scontrol` name it: `<array job>_<task>` for
  a task of a job array, else the job id; None outside a SLURM job.

  A job array's own id names every task of it (`scontrol requeue 7`
  requeues the whole array), and one task's SLURM_JOB_ID can be that id.
  """
  array, task = (environ.get("SLURM_ARRAY_JOB_ID"),
                 environ.get("SLURM_ARRAY_TASK_ID"))
  if job_id(environ) is not None and array and task:
    return f"{array}_{task}"
  return job_id(environ)


def batch_tasks(environ: Mapping[str, str] = os.environ) -> int:
  """Tasks the job asked for, where this process is not an `srun` task but
  the batch script itself (which SLURM starts once); else 0."""
  if job_id(environ) is None or "SLURM_STEP_NUM_TASKS" in environ:
    return 0
  try:
    return int(environ.get("SLURM_NTASKS", "0"))
  except ValueError:
    return 0


def read_step(environ: Mapping[str, str] = os.environ) -> Optional[Step]:
  """Returns the `srun` step this process is a task of, or None.

  Raises:
    errors.ConfigError: For SLURM variables that are missing or cannot be
      parsed, naming the variable and its value.
  """
  if job_id(environ) is None or "SLURM_STEP_NUM_TASKS" not in environ:
    return None
  values = _step_variables(environ)
  try:
    hosts = expand_hostlist(values["SLURM_STEP_NODELIST"])
  except ValueError as e:
    raise errors.ConfigError(
        f"SLURM_STEP_NODELIST ({values['SLURM_STEP_NODELIST']!r}) cannot be "
        f"parsed: {e}.") from e
  try:
    tasks = expand_tasks_per_node(values["SLURM_STEP_TASKS_PER_NODE"])
  except ValueError as e:
    raise errors.ConfigError(
        "SLURM_STEP_TASKS_PER_NODE "
        f"({values['SLURM_STEP_TASKS_PER_NODE']!r}) cannot be parsed: {e}."
    ) from e
  numbers = {}
  for name in ("SLURM_LOCALID", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS"):
    if not values[name].isdigit():
      raise errors.ConfigError(
          f"{name} ({values[name]!r}) is not a number.")
    numbers[name] = int(values[name])
  step = Step(job_id=job_id(environ),
              step_id=environ.get("SLURM_STEP_ID",
                                  environ.get("SLURM_STEPID", "0")),
              nodelist=values["SLURM_STEP_NODELIST"], hosts=tuple(hosts),
              tasks_per_node=tuple(tasks), node=values["SLURMD_NODENAME"],
              local_id=numbers["SLURM_LOCALID"],
              proc_id=numbers["SLURM_PROCID"])
  _check_consistent(step, values["SLURM_STEP_TASKS_PER_NODE"],
                    numbers["SLURM_STEP_NUM_TASKS"])
  return step


def _step_variables(environ: Mapping[str, str]) -> Dict[str, str]:
  """The variables `srun` sets that a step is read from, stripped.

  Raises:
    errors.ConfigError: Naming the first one that is not set.
  """
  values = {}
  for name in ("SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE",
               "SLURMD_NODENAME", "SLURM_LOCALID", "SLURM_PROCID",
               "SLURM_STEP_NUM_TASKS"):
    if not environ.get(name, "").strip():
      raise errors.ConfigError(
          f"{name} is not set in this SLURM step (job {job_id(environ)}): "
          "run the command with srun, which sets it.")
    values[name] = environ[name].strip()
  return values


def _check_consistent(step: Step, tasks_per_node: str,
                      num_tasks: int) -> None:
  """Checks that the step's variables describe one step, this task in it.

  Args:
    step: The step read.
    tasks_per_node: `SLURM_STEP_TASKS_PER_NODE` as SLURM wrote it.
    num_tasks: `SLURM_STEP_NUM_TASKS`.

  Raises:
    errors.ConfigError: Naming the variables that disagree.
  """
  hosts, tasks = step.hosts, step.tasks_per_node
  if len(hosts) != len(tasks) or len(set(hosts)) != len(hosts):
    raise errors.ConfigError(
        f"SLURM_STEP_NODELIST ({step.nodelist!r}: {len(hosts)} node(s)) and "
        f"SLURM_STEP_TASKS_PER_NODE ({tasks_per_node!r}:"
        f" {len(tasks)} count(s)) do not describe the same distinct nodes.")
  if step.num_tasks != num_tasks:
    raise errors.ConfigError(
        f"SLURM_STEP_TASKS_PER_NODE adds up to {step.num_tasks} tasks, "
        f"SLURM_STEP_NUM_TASKS says {num_tasks}.")
  if step.node not in hosts:
    raise errors.ConfigError(
        f"this node, SLURMD_NODENAME ({step.node!r}), is not in "
        f"SLURM_STEP_NODELIST ({step.nodelist!r}).")
  if step.local_id >= step.local_tasks:
    raise errors.ConfigError(
        f"SLURM_LOCALID ({step.local_id}) is not below the "
        f"{step.local_tasks} task(s) SLURM_STEP_TASKS_PER_NODE gives node "
        f"{step.node}.")


def port_base(step: Step, configured: Optional[int]) -> int:
  """The first port of this job's tasks on each node: `configured`
  (`runtime.port_base`), else derived from the job id so that every task
  of the step, and no other job's, takes the same."""
  if configured is not None:
    return configured
  return DEFAULT_PORT_BASE + PORTS_PER_JOB * (
      int(step.job_id) % 1000 if step.job_id.isdigit() else 0)


def cluster(step: Step, strategy: str, base: int, num_ps: int = 0,
            evaluator: bool = False) -> Tuple[Dict[str, List[str]], str, int]:
  """The TF_CONFIG cluster of `strategy` over the step's tasks.

  `multi_worker_mirrored`: every task is a worker. `parameter_server`: task
  0 is the chief, the next `num_ps` are parameter servers, the rest
  workers, and with `evaluator` the last task is the sidecar evaluator
  (outside the cluster, as TensorFlow wants it).

  Returns:
    The cluster (task type -> addresses), this task's type and index.

  Raises:
    errors.ConfigError: If the step has too few tasks for the split.
  """
  addresses = step.addresses(base)
  index = step.index
  if strategy == "multi_worker_mirrored":
    return {"worker": addresses}, "worker", index
  needed = 2 + num_ps + int(evaluator)
  if len(addresses) < needed:
    raise errors.ConfigError(
        f"'parameter_server' with `runtime.num_ps`={num_ps}"
        f"{' and `runtime.evaluator_task`' if evaluator else ''} needs at "
        f"least {needed} SLURM tasks (a chief, the ps, a worker"
        f"{', the evaluator' if evaluator else ''}); {step.describe()} has "
        f"{len(addresses)} (srun -n{len(addresses)}).")
  end = len(addresses) - int(evaluator)
  spec = {"chief": addresses[:1], "ps": addresses[1:1 + num_ps],
          "worker": addresses[1 + num_ps:end]}
  if index == 0:
    return spec, "chief", 0
  if index <= num_ps:
    return spec, "ps", index - 1
  if index < end:
    return spec, "worker", index - 1 - num_ps
  return spec, "evaluator", 0


def gpus_for_task(num_visible: int, step: Step,
                  environ: Mapping[str, str] = os.environ
                  ) -> Optional[List[int]]:
  """Which of the GPUs this task sees it should use, or None for all.

  Where SLURM binds GPUs to tasks itself (`--gpus-per-task`), each task
  sees only its own. Otherwise the tasks of a node see the same GPUs and
  take equal, disjoint shares by local id.

  Raises:
    errors.ConfigError: If the node's tasks cannot get disjoint shares.
  """
  if num_visible == 0 or step.local_tasks == 1 or environ.get(
      "SLURM_GPUS_PER_TASK"):
    return None
  if num_visible % step.local_tasks:
    raise errors.ConfigError(
        f"{step.local_tasks} SLURM tasks on {step.node} share {num_visible} "
        "GPU(s), which do not split evenly between them: ask for one GPU "
        "per task (srun --gpus-per-task=1) or a multiple of the tasks per "
        "node.")
  share = num_visible // step.local_tasks
  return list(range(step.local_id * share, (step.local_id + 1) * share))


def requeue(environ: Mapping[str, str] = os.environ) -> str:
  """Requeues this SLURM job (`scontrol requeue`); returns what happened,
  for the exit line.

  The requeued job starts again from its batch script once SLURM schedules
  it, and resumes from the newest checkpoint. SLURM sends SIGTERM to the
  job's tasks as it requeues, so call this only once the checkpoint is
  saved.
  """
  job = job_name(environ)
  if job is None:
    return "not in a SLURM job, so nothing to requeue"
  try:
    result = subprocess.run(["scontrol", "requeue", job], capture_output=True,
                            text=True, timeout=30, check=False)
  except (OSError, subprocess.TimeoutExpired) as e:
    return f"SLURM job {job} not requeued ({e}); submit it again"
  if result.returncode:
    reason = (result.stderr.strip().splitlines() or ["no reason given"])[-1]
    return (f"SLURM job {job} not requeued ({reason.strip()}); submit it "
            "again")
  return f"SLURM job {job} requeued"


def requeue_outcome(is_chief: bool,
                    environ: Mapping[str, str] = os.environ) -> str:
  """What becomes of the job after a stop for SIGUSR1, for the exit line:
  the chief requeues it (`requeue`), the other tasks leave it to the chief.
  """
  job = job_name(environ)
  if job is None:
    return ("not in a SLURM job, so nothing to requeue: run the same command "
            "again")
  if not is_chief:
    return f"the chief requeues SLURM job {job}"
  return requeue(environ)


def kill_wait_seconds(environ: Mapping[str, str] = os.environ
                      ) -> Optional[int]:
  """SLURM's `KillWait`, the seconds between its SIGTERM and its SIGKILL,
  read with `scontrol show config` inside a SLURM job; None outside one,
  or where it cannot be read."""
  if job_id(environ) is None:
    return None
  try:
    result = subprocess.run(["scontrol", "show", "config"],
                            capture_output=True, text=True, timeout=10,
                            check=False, env=dict(environ))
  except (OSError, subprocess.TimeoutExpired):
    return None
  match = re.search(r"^KillWait\s*=\s*(\d+)", result.stdout, re.MULTILINE)
  return int(match.group(1)) if match else None
