"""The training core: the loop (trainer), checkpoints, schedules, metrics, the run directory and
the callback seam the instruments plug into. Engines and instruments wrap it from outside."""
