"""The workflow's Python (what recipes/Snakefile's rules run; what a person runs is in ``scripts/``):

- workflow.py: Study, what recipes/Snakefile builds its jobs from, made of: configuration.py (the
  study's configuration read, checked when the workflow is parsed, each model's settings),
  paths.py (where its files go), commands.py (fairseq-train's and fairseq-generate's commands),
  estimates.py (the corpus's size and the speed the plan starts from); rows.py: the rows and their
  models; choices.py: what the schema's choices mean; trained_code.py: the code a model trains
  with; segments.py: what decodes and the length report count in; base.py: ConfigError, ROOT and
  the other names all share, importing nothing of the package; train_config.py: the resolved
  configuration and the hash that names a model's checkpoint directory; train_job.py: one
  training job (budget, record); checkpoint_pick.py: the checkpoint it goes on from; cluster.py:
  the jobs' SLURM resources;
- sources.py: the files of the checkout a script runs (a rule's inputs, a model's code key);
- plan.py: the plan of each model before training, disk space;
- corpus.py: a corpus's preparation commands and settings (the rules' params), its test sets;
  prepare.py: its preparation steps (a files corpus's gathered first); short_to_long.py and
  length_bins.py: the length split of a prepared corpus; toy_corpus.py: the demo's generated pair;
  wmt_data.py: the archives (download, extraction); text.py: tokenize, clean, lowercase,
  sentencepiece;
- generation.py: fairseq-generate's output, read; scoring.py: SacreBLEU and tokenized BLEU;
  rerank.py: GNMT's length penalty by reranking an n-best list; report.py: the studies' reports;
  length_report.py: the length report (significance.py: its intervals; length_plot.py: its plot;
  decoding_limit.py: its footer); row_names.py: a report's row names; schema_doc.py:
  recipes/README.md's reference;
- pipeline.py: fairseq's commands for the demo, the benchmark and the tests; toy_data.py: the
  toy language pairs.

An installed package (setup.py's package_dir), imported by its name, never through ``sys.path``
edits; its command-line steps are console scripts (``posenc-scoring``, ...) and run as files too
(``python recipes/posenc_workflow/train_job.py ...``, as the rules do). Importing it imports
neither fairseq nor the plugin, which imports nothing of it: ``--user-dir`` loads the plugin's
models and criterions only."""
