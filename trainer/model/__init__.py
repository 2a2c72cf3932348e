"""The model side of a Task: the Task interface, named models, gradients,
loss scaling, optimizers and their parts, EMA, batch scaling and warm start."""
