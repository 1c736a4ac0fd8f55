"""Hyperparameter transfer (SCIENCE.md 21): the coordinate check and size ladders that forecast."""
