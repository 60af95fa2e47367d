"""fairseq-train runs with an fp16 overflow injected into one update, and their twins without that
batch: ``python tests/helpers/overflow_runs.py SPEC OUT``, every run of SPEC in this one process (fairseq's
console entry point ``fairseq_cli.train:cli_main``, its command line in ``sys.argv``).

An overflow is what a loss scale too large for a batch does: the training loss is multiplied by
inf in the criterion's forward (fairseq's own ``label_smoothed_cross_entropy``), so that every
gradient of that pass is inf or nan; fairseq's fp16 optimizer sees it at clipping, skips the update
and halves its loss scale, and the next batch trains the same update. Which ``train_step`` call
overflows (``"overflow"`` in a run's spec):
- an int: that call (0-based);
- ``{"every": N}``: the first call of an update that is not the first of its cycle of N (fairseq's
  update count n with n % N != 0) whose batch is no longer (source or target) than an earlier batch
  of the same cycle; FLOATER's cycle then already holds a gradient at least as long as this one's,
  the case in which a total modified in place could not be rolled back.
A run with ``"skip_like": NAME`` does not run the ``train_step`` call that run NAME overflowed (the
batch is drawn and dropped): the same training without that batch.

OUT gets, per run: ``ok`` (and ``error``), ``overflowed`` (the call index), ``update`` (fairseq's
update count at that call), ``updates`` (the count at the end), ``skipped`` (the calls fairseq did
not count as an update).
"""
import json
import sys
import traceback


def main(spec_path, out_path):
    from fairseq_cli import train  # first: fairseq's CLI sets up its logging
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
    from fairseq.trainer import Trainer

    import fairseq_posenc  # noqa: F401  (installs the plugin's train_step wrapper before the one below)

    run = {}
    forward, train_step = LabelSmoothedCrossEntropyCriterion.forward, Trainer.train_step

    def overflowing_forward(self, model, sample, reduce=True):
        loss, sample_size, logging_output = forward(self, model, sample, reduce)
        if model.training and run.get("overflow_now"):
            run["overflow_now"] = False
            loss = loss * float("inf")
        return loss, sample_size, logging_output

    def counting_train_step(self, samples, *args, **kwargs):
        if run.get("depth"):  # fairseq's --amp retries an overflowed update inside train_step
            return train_step(self, samples, *args, **kwargs)
        call, n = run["calls"], self.get_num_updates()
        run["calls"] += 1
        length = max(max(s["net_input"]["src_tokens"].size(1), s["target"].size(1)) for s in samples if s)
        rule = run["spec"].get("overflow")
        every = rule.get("every") if isinstance(rule, dict) else None
        if every:
            if run["cycle"]["id"] != n // every:
                run["cycle"] = {"id": n // every, "lengths": []}
            lengths = run["cycle"]["lengths"]
            chosen = n % every != 0 and lengths and length <= max(lengths)
            lengths.append(length)
        else:
            chosen = call == rule
        if chosen and "overflowed" not in run["result"]:
            run["result"].update(overflowed=call, update=n)
            run["overflow_now"] = True
        if call == run.get("skip"):
            return None  # the batch is dropped: no forward, no update
        run["depth"] = 1
        try:
            return train_step(self, samples, *args, **kwargs)
        finally:
            run["depth"] = 0
            if self.get_num_updates() == n:
                run["result"]["skipped"].append(call)
            run["result"]["updates"] = self.get_num_updates()

    LabelSmoothedCrossEntropyCriterion.forward = overflowing_forward
    Trainer.train_step = counting_train_step

    with open(spec_path) as f:
        jobs = json.load(f)
    results = {}
    for job in jobs:
        run.clear()
        run.update(spec=job, calls=0, cycle={"id": None, "lengths": []},
                   result={"ok": False, "skipped": [], "updates": 0})
        if "skip_like" in job:
            run["skip"] = results.get(job["skip_like"], {}).get("overflowed")
        sys.argv = ["fairseq-train", *job["argv"]]
        try:
            train.cli_main()
            run["result"]["ok"] = True
        except BaseException:  # argparse's SystemExit too
            run["result"]["error"] = traceback.format_exc()[-3000:]
        results[job["name"]] = run["result"]
        with open(out_path, "w") as f:  # after each run: a crash of the process leaves the runs before it
            json.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:3])
