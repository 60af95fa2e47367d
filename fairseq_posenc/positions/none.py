from .base import PositionEncoding


class NoPositionEncoding(PositionEncoding):
    """No position information: the encoder sees a bag of words, the decoder only its causal
    mask. The floor every encoding should beat."""

    tells_left_from_right = False
