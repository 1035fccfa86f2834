"""Where candidates come from besides LLMs (synth/): torch.compile (compile) and its CUDA-graph
replay (graph), a directory of candidate files (directory), and resolving provider names to
providers (providers).

Pipeline stage: provide.
"""
