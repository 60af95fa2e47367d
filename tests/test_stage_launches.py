"""Several nodes share one stage decision through its record (fairseq_posenc/recipe/stages.py):
the first node decides and records it under the launch's LAUNCH_ID, the others take it. A
LAUNCH_ID used before is refused, and the refusal is recorded so that the other nodes stop at once;
a decision recorded under the same id long before a node started is not this launch's."""
import os
import time

import pytest

from fairseq_posenc.recipe import stages

CONFIG = {"optimization.max_update": 6, "dataset.max_tokens": 100, "optimization.update_freq": [1]}


def test_the_other_nodes_take_the_first_nodes_decision(tmp_path):
    save_dir = str(tmp_path / "stage")
    stages.act(save_dir, "start", {}, CONFIG, launch="job-1")
    assert stages.wait_for_decision(save_dir, "job-1", timeout=1, poll=0.01) == "start"
    with pytest.raises(stages.Refusal, match="waited 0 s for the first node"):
        stages.wait_for_decision(save_dir, "job-2", timeout=0.05, poll=0.01)


def test_a_reused_launch_id_is_refused_and_the_other_nodes_stop_at_once(tmp_path):
    save_dir = str(tmp_path / "stage")
    stages.act(save_dir, "start", {}, CONFIG, launch="job-1")
    started = time.time()
    with pytest.raises(stages.Refusal, match="LAUNCH_ID=job-1 was used before"):
        stages.act(save_dir, "resume", {}, CONFIG, launch="job-1")
    with pytest.raises(stages.Refusal, match="the first node refused: LAUNCH_ID=job-1 was used before"):
        stages.wait_for_decision(save_dir, "job-1", timeout=600, poll=0.01, since=started)
    assert time.time() - started < 5  # not the 600 s of a decision that never comes
    stages.act(save_dir, "resume", {}, CONFIG, launch="job-2")  # a new id goes on
    assert stages.read_json(os.path.join(save_dir, stages.RECORD))["launches"] == ["job-1", "job-2"]


def test_a_decision_recorded_long_before_a_node_started_is_not_its_launchs(tmp_path):
    save_dir = str(tmp_path / "stage")
    stages.act(save_dir, "start", {}, CONFIG, launch="job-1")
    later = time.time() + stages.CLOCK_SLACK + 60  # a node of a launch that reuses the id an hour on
    with pytest.raises(stages.Refusal, match="waited"):
        stages.wait_for_decision(save_dir, "job-1", timeout=0.05, poll=0.01, since=later)


def _finished_checkpoints(save_dir, updates):
    import torch

    for name in ("checkpoint_last.pt", "checkpoint_best.pt"):
        torch.save({"optimizer_history": [{"num_updates": updates}], "extra_state": {}}, os.path.join(save_dir, name))


def test_another_node_waits_for_the_first_nodes_last_save_before_it_fails(tmp_path):
    """Only the first node writes checkpoints: another node whose fairseq-train exited non-zero
    (a teardown abort) waits for the last save instead of failing while it is written."""
    import threading

    save_dir = str(tmp_path / "stage")
    stages.act(save_dir, "start", {}, CONFIG)
    with pytest.raises(stages.Refusal, match="failed with exit code 134 before the stage finished"):
        stages.stage_end(save_dir, 134, first=False, wait=0.05, poll=0.01)
    saving = threading.Timer(0.3, _finished_checkpoints, (save_dir, 6))
    saving.start()
    message = stages.stage_end(save_dir, 134, first=False, wait=30, poll=0.02)
    saving.join()
    assert message.startswith("WARNING: fairseq-train exited with code 134 after the stage finished "
                              "(checkpoint_last.pt is at update 6 (update 6)")
    assert not stages.read_json(os.path.join(save_dir, stages.RECORD))["finished"]  # the first node records it
    assert stages.stage_end(save_dir, 134, first=True).startswith("WARNING")
    assert stages.read_json(os.path.join(save_dir, stages.RECORD))["finished"]


def test_a_record_of_an_older_recipe_is_refused_until_adopted(tmp_path):
    """A stage.json without the resolved configuration (written before it was recorded): refused,
    saying how to adopt it; ADOPT_RUN=1 takes the configuration asked now."""
    save_dir = str(tmp_path / "stage")
    os.makedirs(save_dir)
    _finished_checkpoints(save_dir, 6)
    stages.write_json(os.path.join(save_dir, stages.RECORD), {"settings": {}, "finished": True, "stamp": "x"})
    with pytest.raises(stages.Refusal, match="the record holds no fairseq configuration .* or ADOPT_RUN=1"):
        stages.decide(save_dir, {}, CONFIG)
    assert stages.decide(save_dir, {}, CONFIG, adopt=True) == ("skip", "finished at update 6 (update 6)")


def test_a_stage_restarts_when_the_stage_it_starts_from_trained_again(tmp_path):
    """The record's ``after`` is the stamp of the upstream stage it started from: the same stamp
    resumes or skips, a new one (the upstream finished again) restarts."""
    up, down = str(tmp_path / "vanilla"), str(tmp_path / "floater")
    os.makedirs(up)
    stages.act(up, "start", {}, CONFIG)
    stages.stage_done(up)
    stages.act(down, "start", {}, CONFIG, after_dir=up)
    _finished_checkpoints(down, 6)
    assert stages.decide(down, {}, CONFIG, after_dir=up) == ("skip", "finished at update 6 (update 6)")
    stages.stage_done(up)  # trained again: a new stamp
    assert stages.decide(down, {}, CONFIG, after_dir=up) == (
        "restart", f"{up} was trained again since this stage started from it")
