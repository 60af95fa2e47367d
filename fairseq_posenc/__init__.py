"""fairseq-posenc: position encodings for fairseq Transformers, loaded with ``--user-dir``."""
from . import compat, update_hooks

compat.apply()
update_hooks.install()

from . import criterions, models, options  # noqa: E402,F401  (register with fairseq on import)

models.config.load_checkpoints_as_saved()
models.checkpoint_settings.install()
compat.one_line_flag_errors(options.plugin_flags)
