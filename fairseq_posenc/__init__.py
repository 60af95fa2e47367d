"""fairseq-posenc: position encodings for fairseq Transformers, loaded with ``--user-dir``."""
from . import compat

compat.apply()

from . import models  # noqa: E402,F401  (registers with fairseq on import)
