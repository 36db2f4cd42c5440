"""Models: the `Model` protocol and the `Scripted` test double."""

from ._base import Model, ModelRequest, ToolSpec
from ._scripted import Scripted

__all__ = ["Model", "ModelRequest", "Scripted", "ToolSpec"]
