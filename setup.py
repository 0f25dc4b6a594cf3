"""The package list (everything else is in pyproject.toml). The configs sit at the top of a checkout, `conf/`
beside `llasmol/`, where a newcomer sees them; the wheel carries them as the package `llasmol.conf` (as torchtune
ships its recipes' configs), so a plain `pip install .` finds every config under `llasmol/conf/`."""

from setuptools import find_namespace_packages, setup

CONF = ["llasmol.conf", *(f"llasmol.conf.{name}" for name in find_namespace_packages("conf"))]

setup(packages=[*find_namespace_packages(include=["llasmol", "llasmol.*"]), *CONF],
      package_dir={"llasmol.conf": "conf"})
