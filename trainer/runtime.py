"""Runtime settings: devices, distribution strategy and numeric precision.

`RuntimeConfig` is bound in gin as `runtime.<name>` and checks its fields
against each other on construction. What acts on it lives below the loop:
the strategy in `trainer.distribute.strategy` (which also checks the
cluster, SLURM and partitioner settings when the process is set up), the
precision in `trainer.model.precision`, the seeds in `trainer.model.seeds`,
the tf.data service in `trainer.data.service`.
"""

import dataclasses
from typing import Any, Dict, Optional, Union

import gin

from trainer import checks

STRATEGIES = ("default", "one_device", "mirrored", "multi_worker_mirrored",
              "parameter_server", "central_storage", "tpu")
PRECISIONS = ("float32", "float16", "bfloat16")
GPU_THREAD_MODES = ("gpu_private", "gpu_shared", "global")
ALL_REDUCE_ALGS = {
    "mirrored": ("nccl", "hierarchical_copy"),
    "multi_worker_mirrored": ("ring", "nccl"),
}


@gin.configurable("runtime")
@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
  """Where and how training runs.

  Every field is checked on construction, except what needs the modules
  that act on it, which is checked when the process is set up, before
  anything is written: the worker hosts, port range and partitioner
  (`trainer.distribute.strategy.check`) and the tf.data service
  (`trainer.data.service.check`).

  Attributes:
    distribution_strategy: One of `STRATEGIES`. `default` is TensorFlow's
      default (no-op) strategy.
    mixed_precision_dtype: `float32`, `float16` (with loss scaling) or
      `bfloat16`. Variables stay float32 either way.
    loss_scale: `'dynamic'` or a positive number; used with `float16` only.
    all_reduce_alg: `nccl` or `hierarchical_copy` for `mirrored`, `ring` or
      `nccl` for `multi_worker_mirrored`; None lets TensorFlow choose.
    num_packs: Gradient packing for `mirrored`'s all-reduce.
    run_eagerly: Run train and eval steps without `tf.function`, so Python
      breakpoints and prints work inside them.
    worker_hosts: Comma-separated `host:port` list of a multi-worker cluster;
      the framework writes TF_CONFIG from it. Without it,
      `multi_worker_mirrored` reads an existing TF_CONFIG.
    task_index: This process's index in `worker_hosts`.
    port_base: Under `srun` without TF_CONFIG or `worker_hosts`, the cluster
      comes from the SLURM step, and each task listens on this port plus
      its local id on its node; None takes
      `15000 + 16 * (SLURM_JOB_ID % 1000)`, the same for every task of a
      job and different for jobs sharing a node.
    num_ps: Under `srun` with 'parameter_server': how many tasks, after the
      chief (task 0), serve as parameter servers; the rest are workers.
    evaluator_task: Under `srun` with 'parameter_server': the last task is
      the sidecar evaluator, evaluating the chief's checkpoints
      (`--mode=continuous_eval`, whatever `--mode` the tasks share).
    enable_xla: Compile the per-replica computation with XLA (`jit_compile`).
    tpu: TPU address for `TPUClusterResolver` (`local` for TPUs attached to
      this host).
    num_gpus: GPUs used by `one_device` (at most 1) and `mirrored`.
    num_cpu_devices: Split the host CPU into this many logical devices, so
      `mirrored` runs that many replicas on a machine without accelerators.
      0 or 1 leaves the CPU whole.
    seed: Seeds Python, NumPy and TensorFlow before the model is built, so
      runs start from the same weights; None leaves them unseeded.
    deterministic: Make reruns and resumed runs bit-identical: turns on
      `tf.config.experimental.enable_op_determinism()` and seeds everything
      from `seed` (0 when unset); warns if the train step uses stateful
      random ops, which a checkpoint cannot resume.
    gpu_thread_mode: `gpu_private`, `gpu_shared` or `global`: TensorFlow's
      GPU kernel-launch threads (TF_GPU_THREAD_MODE); needs `num_gpus`.
    per_gpu_thread_count: Threads per GPU with `gpu_thread_mode`; 0 is 2.
    dataset_num_private_threads: A private tf.data thread pool of this size
      for the training input; 0 uses the shared pool.
    dataset_batch_parallel_calls: `Task.preprocess_batch` calls at once: 0
      runs them in the prefetch thread (best where training shares the CPU
      with its input, measured), -1 lets tf.data choose (`AUTOTUNE`; for
      heavy per-batch work on accelerator hosts), N runs N.
    dataset_deterministic: Keep the input's element order where tf.data
      could trade it for speed (parallel map and interleave); False may be
      faster, but then neither reruns nor resumed runs see the same batches.
    model_parallel_devices: Place parts of the model on this many devices
      (GPUs, else logical CPUs), for a Task that places them
      (`trainer.distribute.placement`); 0 or 1 turns it off. Needs the
      `default` strategy.
    variable_partitioner: Shard large variables over the parameter servers
      (`parameter_server` only): None, `min_size`, `max_size` or
      `fixed_shards` (TensorFlow's `MinSizePartitioner`,
      `MaxSizePartitioner`, `FixedShardsPartitioner`).
    variable_partitioner_args: The partitioner's keyword arguments, e.g.
      `{"max_shard_bytes": 1048576}` for `max_size`, `{"num_shards": 2}` for
      `fixed_shards`; None for its defaults.
    data_service: A tf.data service dispatcher address
      (`grpc://host:port`): the training input is then produced by its
      workers (`scripts/data_service.py` starts both); None reads it here.
    data_service_mode: `distributed_epoch` (each data worker reads a part
      of the data: every example once per epoch) or `parallel_epochs`
      (each data worker reads all of it, in its own order).
    data_service_job_name: Trainers naming the same job share one stream
      of batches (each batch goes to one of them); None gives each trainer
      its own.
    data_service_timeout: Seconds training waits for a batch from the
      service (twice as long before the first step) before it saves the
      step it reached and exits 1, naming the dispatcher and the workers it
      last saw; None waits as long as it takes.
    cluster_wait_timeout: Seconds a 'parameter_server' chief waits for its
      workers and parameter servers to answer at their addresses before it
      exits 1, naming those that do not, with nothing written; it says
      which it waits for after 3 s, then every 30 s. None waits as long as
      it takes.
  """
  distribution_strategy: str = "default"
  mixed_precision_dtype: str = "float32"
  loss_scale: Union[str, float] = "dynamic"
  all_reduce_alg: Optional[str] = None
  num_packs: int = 1
  run_eagerly: bool = False
  worker_hosts: Optional[str] = None
  task_index: int = -1
  port_base: Optional[int] = None
  num_ps: int = 0
  evaluator_task: bool = False
  enable_xla: bool = False
  tpu: Optional[str] = None
  num_gpus: int = 0
  num_cpu_devices: int = 0
  seed: Optional[int] = None
  deterministic: bool = False
  gpu_thread_mode: Optional[str] = None
  per_gpu_thread_count: int = 0
  dataset_num_private_threads: int = 0
  dataset_batch_parallel_calls: int = 0
  dataset_deterministic: bool = True
  model_parallel_devices: int = 0
  variable_partitioner: Optional[str] = None
  variable_partitioner_args: Optional[Dict[str, Any]] = None
  data_service: Optional[str] = None
  data_service_mode: str = "distributed_epoch"
  data_service_job_name: Optional[str] = None
  data_service_timeout: Optional[float] = 600.0
  cluster_wait_timeout: Optional[float] = 300.0

  def __post_init__(self):
    checks.choice("runtime.distribution_strategy", self.distribution_strategy,
                  STRATEGIES)
    checks.choice("runtime.mixed_precision_dtype", self.mixed_precision_dtype,
                  PRECISIONS)
    checks.require(
        self.loss_scale == "dynamic" or (checks.is_number(self.loss_scale) and
                                         self.loss_scale > 0),
        f"`runtime.loss_scale` ({self.loss_scale!r}) must be 'dynamic' or a "
        "positive number.")
    checks.field_types("runtime", self)
    checks.require(
        not self.deterministic or self.dataset_deterministic,
        "`runtime.deterministic` needs `runtime.dataset_deterministic`: an "
        "input order that may change cannot be resumed exactly.")
    checks.at_least("runtime.num_packs", self.num_packs, 1)
    checks.require(
        self.num_gpus >= 0 and self.num_cpu_devices >= 0,
        "`runtime.num_gpus` and `runtime.num_cpu_devices` must not be "
        "negative.")
    self._check_cluster()
    self._check_threads()
    self._check_devices()
    self._check_scale_out()

  def _check_devices(self) -> None:
    """Checks the strategy against the devices and compilation asked for."""
    if self.all_reduce_alg is not None:
      choices = ALL_REDUCE_ALGS.get(self.distribution_strategy)
      checks.require(
          choices is not None,
          "`runtime.all_reduce_alg` applies to 'mirrored' and "
          f"'multi_worker_mirrored', not '{self.distribution_strategy}'.")
      checks.choice("runtime.all_reduce_alg", self.all_reduce_alg, choices)
    checks.require(
        not (self.num_gpus and self.num_cpu_devices > 1),
        "`runtime.num_gpus` and `runtime.num_cpu_devices` cannot both be set: "
        "replicas are GPUs or CPUs.")
    # Measured: the compiled step fails on the worker with "Trying to access
    # resource ... located in device /job:ps" (XLA known issue
    # tfvariable_on_a_different_device).
    checks.require(
        not (self.enable_xla and
             self.distribution_strategy == "parameter_server"),
        "`runtime.enable_xla` cannot be used with 'parameter_server': XLA "
        "cannot read variables placed on the parameter servers.")
    checks.require(
        not (self.enable_xla and self.distribution_strategy == "tpu"),
        "`runtime.enable_xla` is for CPUs and GPUs: TPU steps are always "
        "compiled with XLA.")
    checks.require(
        self.distribution_strategy not in ("default", "one_device") or (
            self.num_gpus <= 1 and self.num_cpu_devices <= 1),
        f"'{self.distribution_strategy}' runs on one device; use "
        "`runtime.distribution_strategy='mirrored'` for several.")

  def _check_scale_out(self) -> None:
    """Checks model parallelism against the strategy."""
    strategy = self.distribution_strategy
    checks.integer("runtime.model_parallel_devices",
                   self.model_parallel_devices, minimum=0)
    if self.model_parallel_devices > 1:
      # Measured: OneDeviceStrategy creates every variable on its one
      # device, whatever `tf.device` the Task asks for.
      checks.require(
          strategy == "default",
          "`runtime.model_parallel_devices` needs `runtime.distribution_"
          f"strategy='default'`, not '{strategy}': 'one_device' puts every "
          "variable on its one device, and data-parallel strategies copy the "
          "whole model to each replica.")
      checks.require(
          self.num_cpu_devices <= 1 and self.num_gpus == 0,
          "`runtime.model_parallel_devices` picks its devices itself: leave "
          "`runtime.num_cpu_devices` and `runtime.num_gpus` unset.")
      checks.require(
          not self.enable_xla,
          "`runtime.enable_xla` compiles the step for one device; it cannot "
          "be used with `runtime.model_parallel_devices`.")

  def _check_cluster(self) -> None:
    """Checks the multi-worker and TPU fields against the strategy."""
    strategy = self.distribution_strategy
    if self.worker_hosts is not None:
      checks.require(
          strategy == "multi_worker_mirrored",
          "`runtime.worker_hosts` needs `runtime.distribution_strategy="
          f"'multi_worker_mirrored'`, not '{strategy}'.")
    else:
      checks.require(
          self.task_index == -1,
          f"`runtime.task_index` ({self.task_index}) needs "
          "`runtime.worker_hosts`.")
    if self.port_base is not None:
      checks.integer("runtime.port_base", self.port_base, minimum=1024)
    checks.integer("runtime.num_ps", self.num_ps, minimum=0)
    if self.cluster_wait_timeout is not None:
      checks.positive("runtime.cluster_wait_timeout",
                      self.cluster_wait_timeout)
    checks.require(
        strategy == "parameter_server" or not (self.num_ps or
                                                self.evaluator_task),
        "`runtime.num_ps` and `runtime.evaluator_task` split a SLURM step "
        "for 'parameter_server', not for "
        f"'{strategy}'.")
    checks.require(
        strategy != "multi_worker_mirrored" or self.num_cpu_devices <= 1,
        "`runtime.num_cpu_devices` does not apply to "
        "'multi_worker_mirrored': each worker runs its local devices.")
    checks.require(
        strategy != "tpu" or bool(self.tpu),
        "`runtime.distribution_strategy='tpu'` needs `runtime.tpu`: a TPU "
        "address, or 'local' for TPUs on this host.")
    checks.require(
        not self.tpu or strategy == "tpu",
        f"`runtime.tpu` needs `runtime.distribution_strategy='tpu'`, not "
        f"'{strategy}'.")

  def _check_threads(self) -> None:
    """Checks the thread settings against each other and the GPU count."""
    if self.gpu_thread_mode is not None:
      checks.choice("runtime.gpu_thread_mode", self.gpu_thread_mode,
                    GPU_THREAD_MODES)
      checks.require(
          self.num_gpus > 0,
          "`runtime.gpu_thread_mode` needs `runtime.num_gpus` > 0.")
    else:
      checks.require(
          not self.per_gpu_thread_count,
          "`runtime.per_gpu_thread_count` needs `runtime.gpu_thread_mode`.")
    checks.require(
        self.per_gpu_thread_count >= 0 and
        self.dataset_num_private_threads >= 0,
        "`runtime.per_gpu_thread_count` and "
        "`runtime.dataset_num_private_threads` must not be negative.")
    checks.require(
        self.dataset_batch_parallel_calls >= -1,
        "`runtime.dataset_batch_parallel_calls` "
        f"({self.dataset_batch_parallel_calls}) must be -1 (AUTOTUNE), 0 "
        "(in the prefetch thread) or a positive number.")

