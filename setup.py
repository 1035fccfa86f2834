"""Build script: the Objective-C++ Metal launcher is built on macOS only.

Everywhere else the package is pure Python (kernels are compiled at run time by the backends),
so it installs without a compiler toolchain for Objective-C++ and without torch at build time.
"""
import glob
import os
import sys

from setuptools import setup

ext_modules = []
cmdclass = {}
mps_sources = sorted(glob.glob(os.path.join("csrc", "mps", "*.mm")))
if sys.platform == "darwin" and mps_sources and os.environ.get("METAL_ACCEL_NO_EXT") != "1":
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    ext_modules.append(
        CppExtension(
            "metal_accel._mps_ext",
            mps_sources,
            # no -std: torch adds the standard its headers need (C++17 or C++20 by release);
            # manual reference counting, as PyTorch's MPS headers (Objective-C members) expect
            extra_compile_args=["-ObjC++", "-fno-objc-arc"],
            extra_link_args=["-framework", "Metal", "-framework", "Foundation"],
            optional=True,  # a failed build leaves the package on torch.mps.compile_shader
        )
    )
    cmdclass["build_ext"] = BuildExtension

setup(ext_modules=ext_modules, cmdclass=cmdclass)
