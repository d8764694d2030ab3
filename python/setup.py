"""The build step pyproject.toml cannot say: libaft.so into the package.

In the source tree (this file's parent holds the Makefile and lib/aft.h),
`make lib/libaft.so` builds it (nothing when it is up to date) and the
library is copied into the package as aft/libaft.so, where aft/_lib.py looks
first. Outside a tree, an installed libaft.so.1 (ldconfig's, or
AFT_LIBRARY's) is used at run time instead and nothing is copied; with
neither, the build stops and says so. The wheel is then specific to the
platform (it holds a shared library), hence has_ext_modules.
"""

import ctypes.util
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
TREE = os.path.dirname(HERE)


def in_tree():
    return all(os.path.exists(os.path.join(TREE, p)) for p in ("Makefile", "lib/aft.h"))


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        dst = os.path.join(self.build_lib, "aft", "libaft.so")
        if in_tree():
            subprocess.check_call(["make", "-C", TREE, "lib/libaft.so"])
            # the file, not a link: the package holds its own copy
            shutil.copyfile(os.path.realpath(os.path.join(TREE, "lib", "libaft.so")), dst)
        elif os.environ.get("AFT_LIBRARY") or ctypes.util.find_library("aft"):
            print("aft: no source tree around %s: the package will load the installed libaft" % HERE)
        else:
            raise SystemExit("aft: no source tree around %s and no libaft installed: "
                             "build from the aft tree (pip install ./python) or install libaft first" % HERE)


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithLibrary}, distclass=BinaryDistribution)
