"""The run directory: its files and lock, checkpoints and their manifests, consolidation, resume,
RNG state, the signals that stop a run with a checkpoint, the SLURM owner check, metrics.jsonl
(metrics: its writer and readers) and a run read back as data (runs, runfiles)."""
