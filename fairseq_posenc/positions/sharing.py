"""``--position-sharing``: which attention heads and layers share one set of position parameters."""
from dataclasses import dataclass, field
from typing import Optional

from .values import Values

SHARING_CHOICES = ("none", "layers", "heads")


@dataclass
class SharingConfig:
    position_sharing: Optional[str] = field(
        default=None,
        metadata={
            "values": Values(choices=SHARING_CHOICES),
            "help": "share DIET position parameters across 'layers' (each head its own), across "
            "'heads' (each layer its own) or 'none'. Default: layers for diet_abs, none for diet_rel"
        },
    )


def resolve_sharing(sharing: str, num_layers: int, num_heads: int):
    """(sharing, parameter groups, heads per group) for a --position-sharing value."""
    groups = 1 if sharing == "layers" else num_layers
    heads = 1 if sharing == "heads" else num_heads
    return sharing, groups, heads
