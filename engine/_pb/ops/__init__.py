"""The model's operations: each swaps in at model load (its knob on) and launches its kernels."""
