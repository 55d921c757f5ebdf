"""The agent's container image, and the workload and pause images of the real-cluster bench.

One recipe (hack/image/recipe.py) generates the Dockerfile (``python -m hack.image dockerfile``)
and drives a build that needs neither a container daemon nor a registry
(``python -m hack.image build``, hack/image/build.py: its docstring describes the cache).

    from hack.image import build_all, AGENT_IMAGE
    archives = build_all(Path("/tmp/images"))   # image name -> docker-archive tarball
"""

from hack.image.build import build_all, image_names
from hack.image.errors import BuildError
from hack.image.recipe import AGENT_IMAGE, PAUSE_IMAGE, RECIPE, WORKLOAD_IMAGE

__all__ = [
    "AGENT_IMAGE",
    "PAUSE_IMAGE",
    "RECIPE",
    "WORKLOAD_IMAGE",
    "BuildError",
    "build_all",
    "image_names",
]
