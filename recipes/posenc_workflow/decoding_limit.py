"""Whether fairseq-generate's length limit (``--max-len-a``, ``--max-len-b``, the model's positions)
may have cut the outputs a length report scores: the report's footer line."""
import re


_LIMIT = re.compile(r"'max_len_a': ([0-9.eE+-]+), 'max_len_b': ([0-9]+)")


def read_decoding_limit(log_text: str):
    """(max_len_a, max_len_b) from the config line fairseq-generate logs at start, or None."""
    m = _LIMIT.search(log_text)
    return (float(m.group(1)), int(m.group(2))) if m else None


def _limits(max_len_a: float, max_len_b: int, length: int, max_positions: int = None):
    """(allowed, needed) target tokens for a source of ``length`` tokens, rounded down as fairseq's
    SequenceGenerator rounds ``int(a * length + b)`` (so a = 1.5, b = 10 meets its own rule)."""
    allowed = int(max_len_a * length + max_len_b)
    if max_positions is not None:
        allowed = min(allowed, max_positions - 1)
    return allowed, int(1.5 * length + 10)


def first_cut_length(max_len_a: float, max_len_b: int, longest_source: int, max_positions: int = None):
    """The shortest source length L <= ``longest_source`` whose limit allows fewer than 1.5*L + 10
    target tokens, or None. Every length is checked: the two sides are lines in L only before
    ``int()`` rounds them, and the rounded ones can cross between the ends (a = 1.2, b = 11 allows
    11 >= 10 at L = 0 and 17 >= 17 at L = 5, but 15 < 16 at L = 4)."""
    for length in range(longest_source + 1):
        allowed, needed = _limits(max_len_a, max_len_b, length, max_positions)
        if allowed < needed:
            return length
    return None


def decoding_limit_ok(max_len_a: float, max_len_b: int, longest_source: int, max_positions: int = None) -> bool:
    """int(a*L + b) >= int(1.5*L + 10) (and the positions cap) for every source length L from 0
    to the longest."""
    return first_cut_length(max_len_a, max_len_b, longest_source, max_positions) is None


def decoding_limit_note(max_len_a: float, max_len_b: int, longest_source: int, max_positions: int = None,
                        what: str = "fairseq-generate") -> str:
    """One line for the report's footer: whether the decoding limit (fairseq: at most
    ``a * source length + b`` target tokens, and fewer than the model's positions) allows
    1.5x + 10 at every source length up to the longest, so that it is not what shortens a long
    output; where it fails first at a shorter length, the line names that length."""
    allowed, needed = _limits(max_len_a, max_len_b, longest_source, max_positions)
    cut = first_cut_length(max_len_a, max_len_b, longest_source, max_positions)
    verdict = "outputs that long are not cut" if cut is None else "LONG OUTPUTS MAY HAVE BEEN CUT BY IT"
    if cut is not None and cut != longest_source:
        cut_allowed, cut_needed = _limits(max_len_a, max_len_b, cut, max_positions)
        verdict += f" (first at a source of {cut} tokens: {cut_allowed} allowed, {cut_needed} needed)"
    return (f"Decoding limit: {what} --max-len-a {max_len_a:g} --max-len-b {max_len_b}"
            + (f", {max_positions} positions" if max_positions is not None else "")
            + f" allow {allowed} target tokens for the longest source ({longest_source} tokens), "
            f"1.5x + 10 = {needed} needed: {verdict}.")
