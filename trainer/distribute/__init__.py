"""Distribution below the loop: devices, the cluster, SLURM, model placement
and the parameter-server strategy."""
