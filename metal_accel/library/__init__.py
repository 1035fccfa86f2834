"""The shipped kernel library: kernels for what real modules compute (issue 29).

families.py  the computations served, each with a reference in torch and how a module's tensors bind to it
trace.py     a call's computation as canonical ATen text (symbolic batch and sequence dimensions)
match.py     which family a module call belongs to: its trace equals the family's reference's
provider.py  the library as a candidate provider: the family's kernel file with a generated forward
kernels/     <backend>/<family>.py kernel files (C++, CUDA, Metal), shipped with the package
"""
