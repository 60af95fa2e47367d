import sys

from setuptools import find_packages, setup


def floater_extension():
    """FLOATER's rk4 step loops in C++ (fairseq_posenc/csrc), built where torch and a C++ compiler
    are found; without them FLOATER runs the same loops in Python (positions/floater/loops.py)."""
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        print("fairseq-posenc: torch is not importable at build time; FLOATER's C++ rk4 loops are "
              "not built (the Python loops are used)", file=sys.stderr)
        return {}

    class OptionalBuild(BuildExtension):
        def run(self):
            try:
                super().run()
            except Exception as error:  # a missing or failing compiler must not stop the install
                print(f"fairseq-posenc: FLOATER's C++ rk4 loops were not built ({error}); the Python "
                      "loops are used", file=sys.stderr)

    ext = CppExtension("fairseq_posenc._floater_rk4", ["fairseq_posenc/csrc/floater_rk4.cpp"],
                       extra_compile_args=["-O3", "-g0"])
    return {"ext_modules": [ext], "cmdclass": {"build_ext": OptionalBuild.with_options(use_ninja=False)}}


#: the workflow's modules that run as a command (their ``main``), each a console script posenc-STEP;
#: the rules run the same modules as files (python recipes/posenc_workflow/scoring.py ...), as the
#: docs do (tests/unit/test_package_layout.py checks the list against the modules)
WORKFLOW_STEPS = ["plan", "prepare", "report", "rerank", "schema_doc", "scoring", "short_to_long", "text",
                  "toy_corpus", "train_job", "wmt_data"]


setup(
    name="fairseq-posenc",
    version="0.1.0",
    description="Position encodings for fairseq Transformers (DIET, FLOATER, Shaw, T5, RoPE, ALiBi) "
    "as a --user-dir plugin, with WMT recipes and length-extrapolation evaluation",
    # the plugin (what --user-dir loads) and, beside it, the workflow's Python kept with the
    # workflow (recipes/): two packages imported by name, never through sys.path edits
    packages=find_packages(include=["fairseq_posenc", "fairseq_posenc.*"]) + ["posenc_workflow"],
    package_dir={"posenc_workflow": "recipes/posenc_workflow"},
    entry_points={"console_scripts": [f"posenc-{step.replace('_', '-')}=posenc_workflow.{step}:main"
                                      for step in WORKFLOW_STEPS]},
    python_requires=">=3.11",
    # Exact pins live in requirements*.txt and are installed by `make install`; these are the
    # import-time needs, left unpinned so that installing the plugin never replaces torch.
    install_requires=["torch", "sacrebleu", "sentencepiece", "torchdiffeq", "subword-nmt", "sacremoses"],
    **floater_extension(),
)
