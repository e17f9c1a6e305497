"""The launcher of ``hydra/launcher=slurm``; Hydra takes launchers only from the hydra_plugins package."""
