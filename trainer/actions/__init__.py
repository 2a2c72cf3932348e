"""Actions run after a loop's or an evaluation's output, one per module.

Each follows Orbit's `Action` protocol: a callable taking the loop's output
(train actions) or the evaluation's results (eval actions).
"""

from trainer.actions.best_checkpoint import BEST_DIRECTORY
from trainer.actions.best_checkpoint import BEST_RECORD
from trainer.actions.best_checkpoint import BestCheckpoint
from trainer.actions.best_checkpoint import BestCheckpointConfig
from trainer.actions.early_stopping import EARLY_STOPPING_RECORD
from trainer.actions.early_stopping import EarlyStopping
from trainer.actions.early_stopping import EarlyStoppingConfig
from trainer.actions.eval_images import EvalImagesWriter
from trainer.actions.evaluated_record import EvaluatedStepRecorder
from trainer.actions.keras_callbacks import KerasCallbacks
from trainer.actions.metrics_csv import METRICS_CSV
from trainer.actions.metrics_csv import MetricsCsv
from trainer.actions.operative_config import OperativeConfigWriter
from trainer.actions.stateful_random import STATEFUL_RANDOM_OPS
from trainer.actions.stateful_random import stateful_random_ops
from trainer.actions.stateful_random import StatefulRandomCheck

__all__ = ["BEST_DIRECTORY", "BEST_RECORD", "BestCheckpoint",
           "BestCheckpointConfig", "EARLY_STOPPING_RECORD", "EarlyStopping",
           "EarlyStoppingConfig", "EvalImagesWriter",
           "EvaluatedStepRecorder", "KerasCallbacks", "METRICS_CSV",
           "MetricsCsv", "OperativeConfigWriter",
           "STATEFUL_RANDOM_OPS", "StatefulRandomCheck", "stateful_random_ops"]
