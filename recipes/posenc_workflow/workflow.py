"""What recipes/Snakefile builds its jobs from: :class:`Study`, a study's configuration
(configuration.py) with where its files go (paths.py), its jobs' commands (commands.py) and its
plan's estimates (estimates.py); and the names its rules, scripts/demo.py and the tests reach as
``wf.NAME``, from the modules that hold them. The top of the package: none of its modules imports
this one."""
from typing import Dict, List, Optional

from posenc_workflow import commands, estimates, paths
from posenc_workflow.configuration import Configuration
from posenc_workflow.rows import Model

# what the rules, scripts/demo.py and the tests use as wf.NAME
from posenc_workflow.base import CONTROL, ROOT, ConfigError  # noqa: E402,F401
from posenc_workflow.choices import ARCHS, CORPORA, PRECISION_FLAGS, RECIPE_AUTO  # noqa: E402,F401
from posenc_workflow.commands import generate_command  # noqa: E402,F401
from posenc_workflow.plan import local_gpus  # noqa: E402,F401
from posenc_workflow.rows import parse_rows, preflight_label  # noqa: E402,F401
from posenc_workflow.segments import segmentation  # noqa: E402,F401
from posenc_workflow.settings import coerce  # noqa: E402,F401
from posenc_workflow.trained_code import _CODE_CACHE, code_files, code_key, software_versions  # noqa: E402,F401


class Study(Configuration):
    """A study as the rules ask for it: its configuration (rows, models, each model's settings:
    :class:`Configuration`) with where its files go, its jobs' commands and its plan's estimates,
    each worked out by the module that holds that job."""

    def __init__(self, config: dict, preflight: bool = True, given: Optional[dict] = None):
        super().__init__(config, preflight, given)
        self._resolved: Dict[str, tuple] = {}

    # -- where things go (paths.py) ----------------------------------------------------------------
    def data_bin(self) -> str:
        return paths.data_bin(self)

    def test_data_bin(self, test) -> str:
        return paths.test_data_bin(self, test)

    def test_reference(self, test) -> str:
        return paths.test_reference(self, test)

    def model_dir(self, model: Model) -> str:
        return paths.model_dir(self, model)

    def checkpoints_root(self) -> str:
        return paths.checkpoints_root(self)

    # -- commands (commands.py) --------------------------------------------------------------------
    def command(self, model: Model) -> List[str]:
        return commands.train_command(self, model)

    def resolved(self, model: Model):
        """commands.resolve's (configuration, identity) of the model, once a model."""
        if model.key not in self._resolved:
            self._resolved[model.key] = commands.resolve(self, model)
        return self._resolved[model.key]

    def check_same_rows(self):
        commands.check_same_rows(self, self.resolved)

    # -- the plan's estimates (estimates.py) -------------------------------------------------------
    def corpus_estimate(self):
        return estimates.corpus_estimate(self)

    def tokens_per_second(self, model: Model):
        return estimates.tokens_per_second(self, model)
