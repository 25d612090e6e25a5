"""The measure layer: paired A/B benchmarks, statistics, prompts, results windows and plots, the
exactness checks (`verbs`: the exact, score, ab and results verbs), and the measurement tools
run inside engines and on the GPU machine (`tools`). It may import the runtime and series layers."""
