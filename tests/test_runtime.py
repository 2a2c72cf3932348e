"""Runtime settings: checked on construction."""

import pytest

from trainer import errors
from trainer import runtime


@pytest.mark.parametrize("settings,message", [
    (dict(distribution_strategy="mirored"), "`runtime.distribution_strategy`"
     " ('mirored') must be one of"),
    (dict(mixed_precision_dtype="float64"),
     "`runtime.mixed_precision_dtype` ('float64') must be one of"),
    (dict(mixed_precision_dtype="mixed_float16"),
     "`runtime.mixed_precision_dtype` ('mixed_float16') must be one of"),
    (dict(loss_scale=0), "`runtime.loss_scale` (0) must be 'dynamic'"),
    (dict(num_packs=0), "`runtime.num_packs` (0) must be >= 1."),
    (dict(num_gpus=1.5), "`runtime.num_gpus` (1.5) must be an integer."),
    (dict(run_eagerly="yes"), "`runtime.run_eagerly` ('yes') must be True"),
    (dict(seed="1"), "`runtime.seed` ('1') must be an integer or None."),
    (dict(distribution_strategy="mirrored", all_reduce_alg="ring"),
     "`runtime.all_reduce_alg` ('ring') must be one of: nccl, "
     "hierarchical_copy."),
    (dict(distribution_strategy="one_device", all_reduce_alg="nccl"),
     "`runtime.all_reduce_alg` applies to 'mirrored' and "
     "'multi_worker_mirrored', not 'one_device'."),
    (dict(distribution_strategy="multi_worker_mirrored",
          all_reduce_alg="hierarchical_copy"),
     "`runtime.all_reduce_alg` ('hierarchical_copy') must be one of: ring, "
     "nccl."),
    (dict(distribution_strategy="one_device", num_cpu_devices=2),
     "'one_device' runs on one device"),
    (dict(distribution_strategy="mirrored", num_gpus=2, num_cpu_devices=2),
     "cannot both be set"),
    (dict(distribution_strategy="tpu"),
     "`runtime.distribution_strategy='tpu'` needs `runtime.tpu`: a TPU "
     "address, or 'local' for TPUs on this host."),
    (dict(tpu="grpc://1.2.3.4:8470"),
     "`runtime.tpu` needs `runtime.distribution_strategy='tpu'`, not "
     "'default'."),
    (dict(worker_hosts="127.0.0.1:1"),
     "`runtime.worker_hosts` needs `runtime.distribution_strategy="
     "'multi_worker_mirrored'`, not 'default'."),
    (dict(task_index=1), "`runtime.task_index` (1) needs "
     "`runtime.worker_hosts`."),
    (dict(distribution_strategy="multi_worker_mirrored", num_cpu_devices=2),
     "`runtime.num_cpu_devices` does not apply to 'multi_worker_mirrored'"),
    (dict(distribution_strategy="parameter_server", enable_xla=True),
     "`runtime.enable_xla` cannot be used with 'parameter_server': XLA "
     "cannot read variables placed on the parameter servers."),
    (dict(distribution_strategy="tpu", tpu="local", enable_xla=True),
     "TPU steps are always compiled with XLA"),
    (dict(cluster_wait_timeout=0),
     "`runtime.cluster_wait_timeout` (0) must be positive."),
    (dict(cluster_wait_timeout=-30.0),
     "`runtime.cluster_wait_timeout` (-30.0) must be positive."),
])
def test_invalid_settings_fail_on_construction(settings, message):
  with pytest.raises(errors.ConfigError) as raised:
    runtime.RuntimeConfig(**settings)
  # Gin appends where the configurable was called; the CLI keeps line one.
  assert message in str(raised.value).splitlines()[0]


@pytest.mark.parametrize("settings,message", [
    (dict(gpu_thread_mode="gpu_private"),
     "`runtime.gpu_thread_mode` needs `runtime.num_gpus` > 0."),
    (dict(gpu_thread_mode="private", num_gpus=1),
     "`runtime.gpu_thread_mode` ('private') must be one of: gpu_private, "
     "gpu_shared, global."),
    (dict(per_gpu_thread_count=2),
     "`runtime.per_gpu_thread_count` needs `runtime.gpu_thread_mode`."),
    (dict(dataset_num_private_threads=-1), "must not be negative"),
    (dict(dataset_batch_parallel_calls=-2),
     "`runtime.dataset_batch_parallel_calls` (-2) must be -1 (AUTOTUNE), 0 "
     "(in the prefetch thread) or a positive number."),
    (dict(dataset_batch_parallel_calls=1.5),
     "`runtime.dataset_batch_parallel_calls` (1.5) must be an integer."),
])
def test_invalid_thread_settings(settings, message):
  with pytest.raises(errors.ConfigError) as raised:
    runtime.RuntimeConfig(**settings)
  assert message in str(raised.value).splitlines()[0]
