from .base import PositionEncoding


class LearnedPositionEncoding(PositionEncoding):
    """A learned vector per absolute position added to the input (fairseq's own embedding).

    Its table ends at ``--max-source-positions`` / ``--max-target-positions``.
    """

    input_embedding = "learned"
    extrapolates = False
