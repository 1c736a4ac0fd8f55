"""The run directory: its files and lock, checkpoints and their manifests, consolidation, resume,
RNG state, the signals that stop a run with a checkpoint, and the SLURM owner check."""
