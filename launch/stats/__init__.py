"""Statistics: Welch, TOST, the cross-fitted best-lr difference and its jackknife, Holm, exact
Fisher-Pitman permutation counts, and two-group comparisons by a margin. A leaf: it imports
nothing of normlab's but its errors."""
