"""scripts/demo.py (make demo) end to end, on a budget: the files it promises, from the run."""
import json
import os
import subprocess
import sys

DEMO = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "demo.py")


def test_demo_writes_table_json_and_plot(tmp_path):
    proc = subprocess.run([sys.executable, DEMO, "--encodings", "sinusoidal", "alibi", "--max-update", "20",
                           "--train-size", "300", "--test-size", "40", "--size", "tiny", "--out", str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[2/2] training alibi for 20 updates" in proc.stdout
    results = json.load(open(tmp_path / "results.json"))
    assert [row["encoding"] for row in results["rows"]] == ["sinusoidal", "alibi"]
    assert results["edges"] == [3, 13, 19, 25]
    for row in results["rows"]:
        assert row["parameters"] > 100_000 and row["train_seconds"] > 0
        assert all(0 <= row[b] <= 100 for b in ("[3,13)", "[13,19)", "[19,25)", "[25,inf)"))
    table = open(tmp_path / "results.md").read()
    assert table.startswith("| encoding | parameters | training (s) | BLEU [3,13) |")
    assert len([line for line in table.splitlines() if line.startswith("| ")]) == 3  # header + 2 encodings
    assert open(tmp_path / "bleu_by_length.png", "rb").read(8) == b"\x89PNG\r\n\x1a\n"
