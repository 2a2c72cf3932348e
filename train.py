"""Trains and evaluates a gin-configured Task.

Usage:
  python train.py --gin_file=FILE.gin [--gin_file=...] [--gin_param=BINDING]
      --model_dir=DIR [--mode=train_and_eval|train|eval|continuous_eval]
      [--dry_run] [--full_traceback]

Example:
  python train.py --gin_file=gin/digits.gin --model_dir=runs/digits \\
      --gin_param='trainer.train_steps=2000'

The gin files name the Task and every setting (`trainer.*`, `runtime.*`,
`optimizer.*`, ...); `--gin_param` overrides a binding. A run in a
`model_dir` that holds a checkpoint resumes from it. Exit codes: 0 done,
1 a run-time failure, 2 a configuration mistake (one line on stderr), 42
preempted (SIGTERM, SIGINT or SLURM's SIGUSR1) after saving a checkpoint.
"""

import signal

# SIGTERM, SIGINT and SIGUSR1 (SLURM's time-limit warning) are received by a
# thread of their own (see trainer.preemption), even while the main thread
# waits inside TensorFlow: blocked here, before TensorFlow starts threads,
# which inherit the mask.
signal.pthread_sigmask(signal.SIG_BLOCK,
                       {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1})

# pylint: disable=g-import-not-at-top,wrong-import-position
import trainer  # noqa: E402,F401  Selects Keras 2 before TensorFlow loads.
from trainer import cli  # noqa: E402

if __name__ == "__main__":
  cli.run()
