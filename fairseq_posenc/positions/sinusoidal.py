from .base import PositionEncoding


class SinusoidalPositionEncoding(PositionEncoding):
    """Vaswani et al.: fixed sinusoids added to the input (fairseq's own embedding)."""

    input_embedding = "sinusoidal"
