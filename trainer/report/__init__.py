"""What a run tells: TensorBoard summaries, the run report lines, TensorFlow's
own log and the command-line usage text."""
