"""A study: its file format (spec), the plan of runs, the worker pool that trains them, SLURM
submission, the report with its claims, separation statistics, LR-sensitivity protocol and plots,
and the study's status."""
