"""The LR-sensitivity protocol (SCIENCE.md 19; Wortsman et al. 2023): per (recipe, size) the curve
of loss over the learning-rate grid, which runs count as l_0, LR sensitivity, the best rate and the
stable range (curves), and the protocol read from a study's runs (protocol)."""
