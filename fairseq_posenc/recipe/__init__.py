"""What the recipes decide in Python rather than in shell: which configuration a training stage
runs with, and whether what a directory already holds may be reused for it. Nothing here is
imported by ``--user-dir``: fairseq loads the plugin's models and criterions only."""
