"""The server distribution mtgpu (pyproject.toml holds its metadata): setuptools, less the files
of mtgpu/ that the client distribution mtgpu-client owns (clients/python/client_modules.txt), on
which it depends at the same version; the two wheels never hold the same file."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
CLIENT_MANIFEST = HERE / "clients" / "python" / "client_modules.txt"


def client_owned() -> set[str]:
    """The manifest's paths ('mtgpu/...'); building without it would put the client's files in twice."""
    if not CLIENT_MANIFEST.is_file():
        raise SystemExit(f"{CLIENT_MANIFEST} is missing: it names the files the server distribution leaves out")
    lines = (line.strip() for line in CLIENT_MANIFEST.read_text().splitlines())
    return {line for line in lines if line and not line.startswith("#")}


class ServerBuildPy(build_py):
    """build_py without the client-owned modules."""

    def find_package_modules(self, package, package_dir):
        owned = client_owned()
        return [(pkg, mod, path) for pkg, mod, path in super().find_package_modules(package, package_dir)
                if Path(path).as_posix() not in owned]

    def run(self):
        super().run()
        for rel in client_owned():  # left in build/lib by a build from before the split: not this wheel's
            stale = Path(self.build_lib) / rel
            if stale.is_file():
                stale.unlink()


setup(cmdclass={"build_py": ServerBuildPy})
