"""The native profiler-trace reader, built at install as an ordinary extension module.

Everything else is in pyproject.toml. The reader is optional: where no C++ compiler is there
at install, the build of it fails with a warning, the install goes on, and Python reads
profiler traces (the same columns, more slowly). With zlib's headers it inflates gzipped
traces itself; without, it is built without and Python inflates them.
"""

from glob import glob

from pybind11.setup_helpers import Pybind11Extension
from pybind11.setup_helpers import build_ext as pybind11_build_ext
from setuptools import setup
from setuptools.errors import CompileError, LinkError

READER = "dtprof.trace.kineto._scan"


class BuildExt(pybind11_build_ext):
    """Builds the reader with zlib, else without it."""

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except (CompileError, LinkError):
            if "z" not in ext.libraries:
                raise
            self.warn(f"{ext.name}: building without zlib (Python will inflate gzipped traces)")
            ext.libraries.remove("z")
            ext.define_macros.append(("DTPROF_NO_ZLIB", "1"))
            super().build_extension(ext)


setup(
    ext_modules=[
        Pybind11Extension(
            READER,
            sorted(glob("dtprof/trace/kineto/cpp/*.cpp")),
            depends=sorted(glob("dtprof/trace/kineto/cpp/*.h")),
            cxx_std=17,
            libraries=["z"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ],
    cmdclass={"build_ext": BuildExt},
)
