"""What the tests share: toy models and batches (toy.py), fairseq runs in a few processes
(fairseq_runs.py), float tolerances (tolerances.py), miniature corpus archives (toy_archives.py),
the scripts of scripts/ as modules (scripts.py), and stand-ins for programs a test machine lacks (stubs/: put on PATH). Imported as
``from helpers.toy import ...``: pytest.ini puts tests/ on the path."""
