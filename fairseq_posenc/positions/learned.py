from .base import PositionEncoding


class LearnedPositionEncoding(PositionEncoding):
    """A learned vector per absolute position added to the input (fairseq's own embedding).

    Cannot go past ``--max-source-positions`` / ``--max-target-positions``.
    """

    input_embedding = "learned"
    length_limited = True
