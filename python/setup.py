"""Builds strata._native with the repository's own CMake (python/CMakeLists.txt).

`python -m pip install ./python` runs this: it configures the whole strata
tree (one build, one client library), builds only the extension target and
puts it into the wheel. Set STRATA_CMAKE_ARGS for extra -D options and
CMAKE_BUILD_PARALLEL_LEVEL for the job count.
"""
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        if not (ROOT / "client" / "strata_client.h").is_file():
            raise RuntimeError(
                f"strata's Python package builds from the strata source tree; {ROOT} has no client/. "
                "Install with `python -m pip install ./python` from a checkout.")
        cmake = shutil.which("cmake")
        if cmake is None:
            raise RuntimeError("cmake not found: run scripts/install_deps.sh (Debian) first")
        build = Path(self.build_temp).resolve() / "cmake"
        build.mkdir(parents=True, exist_ok=True)
        args = [cmake, "-S", str(ROOT), "-B", str(build),
                "-DCMAKE_BUILD_TYPE=Release",
                f"-DSTRATA_PYTHON={sys.executable}",
                "-DSTRATA_BUILD_TESTS=OFF", "-DSTRATA_BUILD_BENCH=OFF"]
        if shutil.which("ninja"):
            args += ["-G", "Ninja"]
        args += shlex.split(os.environ.get("STRATA_CMAKE_ARGS", ""))
        subprocess.run(args, check=True)
        subprocess.run([cmake, "--build", str(build), "--target", "strata_python_native"], check=True)
        built = list((build / "python" / "strata").glob("_native*.so"))
        if len(built) != 1:
            raise RuntimeError(f"expected one _native*.so in {build}/python/strata, found {built}")
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built[0], target)


setup(ext_modules=[CMakeExtension("strata._native")], cmdclass={"build_ext": CMakeBuild})
