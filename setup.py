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
            extra_compile_args=["-std=c++17", "-ObjC++", "-fobjc-arc"],
            extra_link_args=["-framework", "Metal", "-framework", "Foundation"],
        )
    )
    cmdclass["build_ext"] = BuildExtension

setup(ext_modules=ext_modules, cmdclass=cmdclass)
