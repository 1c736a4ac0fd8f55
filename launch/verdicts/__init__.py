"""Verdicts over seeds (SCIENCE.md 22): the results table as the verdicts read it (results_table),
the pre-registered family's statistics and Holm decision (family), claims files and their
decisions (decide), `normlab verdicts`' report (report), rank flips, the A/A simulation and
power check (aa_simulation), the descriptive growth claims (growth_claims) and the generated doc
blocks."""
