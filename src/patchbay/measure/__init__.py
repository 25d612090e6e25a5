"""The measure layer: paired A/B benchmarks, statistics, prompts, results windows and plots, and
the exactness checks (`verbs`: the exact, score, ab and results verbs). It may import the
runtime and series layers."""
