"""Models: the `Model` protocol, the `Scripted` test double, and the OpenAI and Anthropic providers.

The providers import their SDK only when constructed: `pip install 'signoff[openai]'` or
`'signoff[anthropic]'`.
"""

from ._anthropic import Anthropic
from ._base import Model, ModelRequest, PausedPart, ToolSpec
from ._from_env import from_env
from ._openai import OpenAIChat
from ._scripted import Scripted

__all__ = [
    "Anthropic",
    "Model",
    "ModelRequest",
    "OpenAIChat",
    "PausedPart",
    "Scripted",
    "ToolSpec",
    "from_env",
]
