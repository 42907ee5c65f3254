"""Inputs hpcpar cannot use are refused with one line that names the real cause, and exit status 2:
text too short for one training window, an empty token file, a Hugging Face model family hpcpar does
not implement; and an --init-from file names its own family, so --model is needed only to contradict it."""
import json

import pytest

from hpcpar.checkpoint.consolidated import export
from mpitools import hpcpar, run
from train_helpers import trainer


def refused(args, cwd=None):
    """The one line of a command that must be refused with exit status 2."""
    proc, _ = run(hpcpar() + args, timeout=120, cwd=cwd)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("hpcpar: error: "), proc.stderr
    return lines[0].removeprefix("hpcpar: error: ")


@pytest.fixture
def solo():
    from mpi4py import MPI
    return MPI.COMM_SELF


def test_prepare_refuses_empty_text(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    line = refused(["data", "prepare", str(tmp_path / "empty.txt"), "-o", str(tmp_path / "out")])
    assert line == (f"{tmp_path / 'empty.txt'}: 0 training tokens, too short for one training window: "
                    f"--seq-len 64 needs at least 66")
    assert not (tmp_path / "out" / "train.bin").exists()


def test_prepare_refuses_text_too_short_for_one_window(tmp_path):
    pytest.importorskip("tokenizers")
    (tmp_path / "short.txt").write_text("A short line of text, far from a window of 64 tokens.\n")
    line = refused(["data", "prepare", str(tmp_path / "short.txt"), "-o", str(tmp_path / "out"), "--vocab", "300"])
    assert "training tokens, too short for one training window: --seq-len 64 needs at least 66" in line


def test_training_refuses_an_empty_token_file(tmp_path):
    (tmp_path / "train.bin").write_bytes(b"")
    (tmp_path / "meta.json").write_text(json.dumps({"vocab_size": 40, "dtype": "uint16"}))
    line = refused(["train", "--data", str(tmp_path), "--steps", "1", "--no-progress"])
    assert line == f"{tmp_path / 'train.bin'} holds 0 tokens; a window of --seq-len 64 needs at least 66"


def test_training_refuses_text_too_short_for_one_window(tmp_path):
    (tmp_path / "short.txt").write_text("too short")
    line = refused(["train", "--data", str(tmp_path / "short.txt"), "--seq-len", "16", "--steps", "1"])
    assert line == f"{tmp_path / 'short.txt'} holds 9 tokens; a window of --seq-len 16 needs at least 18"


@pytest.mark.parametrize("config, named", [
    ({"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "num_experts": 8},
     "holds a Qwen2MoeForCausalLM: a mixture of experts hpcpar does not implement (it runs GPT-2 "
     "(GPT2LMHeadModel), Llama (LlamaForCausalLM), Mixtral (MixtralForCausalLM), Qwen3-MoE "
     "(Qwen3MoeForCausalLM), DeepSeek-V3 (DeepseekV3ForCausalLM))"),
    ({"architectures": ["FalconForCausalLM"], "model_type": "falcon"},
     "holds a FalconForCausalLM, a family hpcpar does not implement (it runs GPT-2 (GPT2LMHeadModel), "
     "Llama (LlamaForCausalLM), Mixtral (MixtralForCausalLM), Qwen3-MoE (Qwen3MoeForCausalLM), DeepSeek-V3 "
     "(DeepseekV3ForCausalLM))"),
], ids=["qwen2-moe", "falcon"])
def test_a_family_hpcpar_does_not_implement_is_named(tmp_path, config, named):
    (tmp_path / "config.json").write_text(json.dumps(config))
    line = refused(["train", "--init-from", str(tmp_path), "--steps", "1"])
    assert line == f"--init-from {tmp_path} {named}"


def test_a_llama_file_needs_no_model_flag_and_refuses_a_contradiction(tmp_path, solo):
    t = trainer(solo, model="llama-tiny", layers=2, hidden=32, heads=4, kv_heads=2, seq_len=12, positions=16,
                vocab=32, batch_size=4)                                # the synthetic language's 32 tokens
    export(t, tmp_path / "llama")
    assert json.loads((tmp_path / "llama" / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    proc, _ = run(hpcpar() + ["train", "--init-from", str(tmp_path / "llama"), "--steps", "1", "--no-progress",
                              "--batch-size", "4"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "llama-tiny model" in proc.stdout
    line = refused(["train", "--init-from", str(tmp_path / "llama"), "--model", "tiny", "--steps", "1"])
    assert line == (f"--model tiny contradicts --init-from {tmp_path / 'llama'}, which holds a Llama "
                    f"(LlamaForCausalLM) (without --model the family comes from the file)")


@pytest.mark.parametrize("factor", ["0", "-1"])
def test_a_capacity_factor_not_above_zero_is_refused(factor):
    """Dropless routing is the option left out; a given factor <= 0 is a mistake, refused in one line."""
    line = refused(["train", "--model", "moe-tiny", "--steps", "1", "--capacity-factor", factor])
    assert line == (f"--capacity-factor must be positive, got {float(factor)} (dropless routing, every choice "
                    f"computed, is the default: leave the option out)")
