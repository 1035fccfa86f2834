"""The Metal (MPS) backend: shaders compiled by torch.mps.compile_shader or the Objective-C++
launcher (library, launch), driven by backend."""
