"""Reading finished, running or diverged runs, and writing the compare report (tables, plots)."""
