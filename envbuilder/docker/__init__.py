"""Docker images of combinations: the layer plan, the wheel cache, the build, and the
conformance suite run in a container of an image."""

from __future__ import annotations

from envbuilder.docker.build import ensure_image, push_image
from envbuilder.docker.plan import GROUPS, LayerPlan, LockedWheel, image_tag, plan_layers

__all__ = [
    "GROUPS",
    "LayerPlan",
    "LockedWheel",
    "ensure_image",
    "image_tag",
    "plan_layers",
    "push_image",
]
