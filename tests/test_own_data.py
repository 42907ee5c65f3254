"""docs/own_data.md, executed: prepare -> train with validation -> generate on the shipped sample text (a
GPT-2, then a Llama), then a Hugging Face GPT-2 in and out, every command and code block in the order the
chapter gives them."""
import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from mpitools import hpcpar, run
from reference import available

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "own_data.md"


def blocks():
    """(language, text) of every program of the chapter: its bash commands and python blocks."""
    return re.findall(r"```(bash|python)\n(.*?)```", DOC.read_text(), re.S)


def command(line):
    args = shlex.split(line)
    assert args[0] == ".venv/bin/hpcpar", line
    return hpcpar() + args[1:] + (["--no-progress"] if args[1] == "train" else [])


def test_the_chapter_runs_on_the_shipped_sample(tmp_path):
    pytest.importorskip("tokenizers")
    (tmp_path / "data").symlink_to(ROOT / "data")
    # the Hugging Face section needs the references (reference.py); the rest runs without them
    has_transformers = available("torch", "transformers")
    outputs = {}
    for lang, text in blocks():
        uses_hf = "transformers" in text or "runs/hf-" in text
        if uses_hf and not has_transformers:
            continue                      # the Hugging Face section needs the test-only dependency
        if lang == "python":
            proc, _ = run([sys.executable, "-c", text], timeout=300, cwd=tmp_path)
        else:
            proc, _ = run(command(text.strip()), timeout=300, cwd=tmp_path)
            outputs.setdefault(shlex.split(text)[1], []).append(proc.stdout)    # each sub-command's, in order
        assert proc.returncode == 0, text + proc.stdout + proc.stderr
    quoted = DOC.read_text()
    prepared = outputs["data"][0].strip()
    assert prepared.startswith("runs/sample: 24,382 characters") and "vocabulary 512, uint16" in prepared
    assert prepared in quoted                 # tokenizer training is deterministic: the same counts
    assert re.findall(r"^step +(\d+)/150  val_loss", outputs["train"][0], re.M) == ["50", "100", "150"]
    records = [json.loads(line) for line in (tmp_path / "runs" / "sample.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "val_loss" in r] == [49, 99, 149]
    plot = next(b for b in re.findall(r"```python\n(.*?)```", (DOC.parent / "quickstart.md").read_text(), re.S)
                if "matplotlib" in b)
    assert "val_loss" in plot
    proc, _ = run([sys.executable, "-c", plot.replace("runs/tiny.jsonl", "runs/sample.jsonl")], timeout=120,
                  cwd=tmp_path)
    assert proc.returncode == 0 and (tmp_path / "loss.png").stat().st_size > 1000, proc.stderr
    for text in outputs["generate"]:                                   # the GPT-2, then the Llama
        assert text.startswith("Alice was") and len(text.split()) > 10, text
    assert len(outputs["generate"]) == 2 and (tmp_path / "runs" / "sample-llama" / "latest").is_file()
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert (tmp_path / "runs" / "sample-model" / name).is_file()
    proc, _ = run(hpcpar() + ["train", "--layers", "2", "--steps", "1", "--export", "runs/two-layers.safetensors"],
                  cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    proc, _ = run(hpcpar() + ["train", "--init-from", "runs/two-layers.safetensors", "--layers", "4"], cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() in quoted, proc.stderr


def test_prepare_refuses_bad_input_with_one_line(tmp_path):
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    proc, _ = run(hpcpar() + ["data", "prepare", str(tmp_path / "latin1.txt"), "-o", str(tmp_path / "out")])
    assert proc.returncode == 2 and "as UTF-8 text" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_prepare_uses_a_tokenizer_the_user_has_and_uint32_for_big_vocabularies(tmp_path):
    pytest.importorskip("tokenizers")
    from hpcpar.training.text import prepare, train_tokenizer
    text = (ROOT / "data" / "sample.txt").read_text()
    tok = train_tokenizer([text], 300)
    tok.add_tokens([f"<extra{i}>" for i in range(1 << 16)])          # a vocabulary past uint16
    tok.save(str(tmp_path / "big.json"))
    meta = prepare([ROOT / "data" / "sample.txt"], tmp_path / "big", tokenizer=tmp_path / "big.json",
                   progress=False)
    assert meta["dtype"] == "uint32" and meta["vocab_size"] > 1 << 16
    assert (tmp_path / "big" / "train.bin").stat().st_size == 4 * meta["train_tokens"]
