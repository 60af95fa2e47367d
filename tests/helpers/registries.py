"""The plugin's classes in fairseq's registries (MODEL_REGISTRY, CRITERION_REGISTRY), and the
fairseq classes they derive from: what the flag walks compare the plugin's options against."""


def plugin(cls) -> bool:
    return cls.__module__.startswith("fairseq_posenc")


def registered(registry, cls) -> str:
    return next(name for name, other in registry.items() if other is cls)


def fairseq_base(registry, cls) -> str:
    """The name of the fairseq class that ``cls`` derives from, as registered."""
    return next(registered(registry, base) for base in cls.__mro__[1:]
                if base in registry.values() and not plugin(base))
