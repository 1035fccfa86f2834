"""The MSL emulator backend ("mps-emu"): Metal kernels translated to C++ (msl_lexer, msl_rewrite,
msl_signature, msl_translate) and run on the CPU (backend). Correctness only, never Metal speed."""
