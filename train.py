"""Trains and evaluates a gin-configured Task; see `trainer.cli`.

Example:
  python train.py --gin_file=gin/digits.gin --model_dir=runs/digits
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
