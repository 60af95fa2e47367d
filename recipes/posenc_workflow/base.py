"""What the workflow's modules share, importing none of them: the checkout, the plugin's folder
(fairseq's ``--user-dir``), the one-line refusal, and the names of FLOATER's protocol."""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
USER_DIR = os.path.join(ROOT, "fairseq_posenc")
#: the encodings trained by FLOATER's protocol: warm-started from a sinusoidal model (the paper's
#: Appendix B.2; the RNN encoders of its Table 6 take FLOATER's place in the same blocks)
WARM_STARTED = ("floater", "rnn")
CONTROL = "vanilla_continued"
VANILLA = "vanilla"


class ConfigError(ValueError):
    """A configuration the workflow refuses: the message is the one line the user sees."""
