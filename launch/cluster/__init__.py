"""SLURM: the cluster file, sbatch script rendering, job queries, submission and requeue.

`normlab submit` and `normlab study --submit` render one batch script per run (one srun task per
node, each running `normlab launch` = torchrun with c10d rendezvous on the job's first host),
submit it with sbatch and record the job id in the run directory. On USR1 (sent `signal_grace_s`
before the time limit) the ranks checkpoint at the end of their step and the job requeues itself;
the requeued job resumes from `latest`.
"""
