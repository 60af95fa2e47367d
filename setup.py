import os
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


def workflow_steps():
    """posenc-STEP for each module of the workflow package that runs as a command (its ``main``):
    the rules run the same modules as files (python recipes/posenc_workflow/scoring.py ...), as
    the docs do."""
    folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "recipes", "posenc_workflow")
    steps = []
    for name in sorted(n for n in os.listdir(folder) if n.endswith(".py")):
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            if 'if __name__ == "__main__":\n    main()' in f.read():
                steps.append(f"posenc-{name[:-3].replace('_', '-')}=posenc_workflow.{name[:-3]}:main")
    return steps


setup(
    name="fairseq-posenc",
    version="0.1.0",
    description="Position encodings for fairseq Transformers (DIET, FLOATER, Shaw, T5, RoPE, ALiBi) "
    "as a --user-dir plugin, with WMT recipes and length-extrapolation evaluation",
    # the plugin (what --user-dir loads) and, beside it, the workflow's Python kept with the
    # workflow (recipes/): two packages imported by name, never through sys.path edits
    packages=find_packages(include=["fairseq_posenc", "fairseq_posenc.*"]) + ["posenc_workflow"],
    package_dir={"posenc_workflow": "recipes/posenc_workflow"},
    entry_points={"console_scripts": workflow_steps()},
    python_requires=">=3.11",
    # Exact pins live in requirements*.txt and are installed by `make install`; these are the
    # import-time needs, left unpinned so that installing the plugin never replaces torch.
    install_requires=["torch", "sacrebleu", "sentencepiece", "torchdiffeq", "subword-nmt", "sacremoses"],
    **floater_extension(),
)
