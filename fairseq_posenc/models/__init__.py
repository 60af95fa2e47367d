from . import transformer_posenc  # noqa: F401  (registers the model and its architectures)
