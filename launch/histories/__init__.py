"""Histories: training logs written by another trainer (TensorBoard event files, a JSONL or CSV
metric history) or by normlab, read into one shape (launch/histories/history.py) so that
`normlab compare`, `warnings` and `verdicts` analyse them like normlab runs (issue 51)."""
