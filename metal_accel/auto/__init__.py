"""`import metal_accel` alone: the import hook that patches classes with cached kernels (hook),
finding a cached kernel for one call (autoload), and recording calls that had none (record).

Sits on top of the store and the proof: a cached kernel is proven here before its first use.
"""
