from . import relation_distillation  # noqa: F401  (registers the criterion)
