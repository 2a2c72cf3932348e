"""What a run keeps on disk: checkpoints, the model_dir lease, file helpers
and SavedModel exports."""
