"""Divergence early warning (SCIENCE.md 23): the events a run had, the online detector of a
precursor signal, and the evaluation of signals by lead time and false alarms."""
