from setuptools import find_packages, setup

setup(
    name="fairseq-posenc",
    version="0.1.0",
    description="Position encodings for fairseq Transformers (DIET, FLOATER, Shaw, T5, RoPE, ALiBi) "
    "as a --user-dir plugin, with WMT recipes and length-extrapolation evaluation",
    packages=find_packages(include=["fairseq_posenc", "fairseq_posenc.*"]),
    python_requires=">=3.11",
    # Exact pins live in requirements*.txt and are installed by `make install`; these are the
    # import-time needs, left unpinned so that installing the plugin never replaces torch.
    install_requires=["torch", "sacrebleu", "sentencepiece", "torchdiffeq", "subword-nmt", "sacremoses"],
)
