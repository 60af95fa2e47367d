"""The recipes' internals (what ``recipes/`` runs; what a person runs is in ``scripts/``):

- steps.py: the entry point of the step markers and training stages (stages.py decides a stage
  from its record, train_config.py resolves fairseq's configuration, flags.py splits FLOATER's);
- plan.py: the plan before training, the device flags, the finished-run check, disk space;
- wmt_data.py: the corpora's archives (download, content fingerprint, extraction);
- text.py: tokenize, clean, lowercase, sentencepiece; scoring.py: SacreBLEU and tokenized BLEU;
  rerank.py: GNMT's length penalty by reranking an n-best list.

The recipes run each as a file (``python fairseq_posenc/recipe/steps.py ...``): then this package
is not imported, and neither is fairseq unless the command needs it. Nothing here is imported by
``--user-dir``: fairseq loads the plugin's models and criterions only."""
