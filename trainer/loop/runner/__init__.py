"""The runners: `runners.TaskTrainer` steps a Task inside one compiled loop
(the per-replica step, the first-step check, summary sums, the input's
position), the parameter-server chief's trainer, the evaluator, and the
adapter that gives a plain Orbit runner what the controller's loop needs."""
