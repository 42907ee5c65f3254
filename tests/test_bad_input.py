"""Inputs hpcpar cannot use are refused with one line that names the real cause, and exit status 2:
text too short for one training window, an empty token file, a Hugging Face model family hpcpar does
not implement; and an --init-from file names its own family, so --model is needed only to contradict it."""
import json
from pathlib import Path

import numpy as np
import pytest

from hpcpar.checkpoint.consolidated import export
from mpitools import hpcpar, in_process, run
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


# --- every file and number checked before the first step: in this process, through main() ----

TINY = ["--layers", "2", "--hidden", "16", "--heads", "2", "--seq-len", "8", "--batch-size", "4", "--steps", "2",
        "--no-progress", "--hang-timeout", "0", "--shutdown-timeout", "0"]


@pytest.fixture
def said(capfd, monkeypatch):
    """The one error line of ``hpcpar ARGS`` run in this process, its exit status asserted (2: bad input;
    1: a fault at run time); never a traceback nor an exception's name."""
    monkeypatch.setattr("hpcpar.training.loop.Loop.measure_gemm_rate", lambda self: 1e12)

    def said(args, status=2):
        got, err = in_process(capfd, args)
        lines = [ln for ln in err.splitlines() if ln.startswith("hpcpar: ")]
        assert got == status and len(lines) == 1 and "Traceback" not in err, (got, err)
        assert not any(f"{name}:" in lines[0] for name in ("Error", "KeyError", "IndexError", "TypeError",
                                                          "ValueError", "AttributeError")), lines[0]
        return lines[0].removeprefix("hpcpar: error: ")
    return said


@pytest.fixture
def tokens(tmp_path):
    """A prepared data directory: train.bin of 200 ids below 31, val.bin of 100, no meta.json yet."""
    d = tmp_path / "data"
    d.mkdir()
    np.arange(200, dtype=np.uint16).__mod__(31).astype(np.uint16).tofile(d / "train.bin")
    np.arange(100, dtype=np.uint16).__mod__(31).astype(np.uint16).tofile(d / "val.bin")
    return d


@pytest.mark.parametrize("meta, message", [
    ([1, 2], "meta.json must hold a JSON object, not list"),
    ({"vocab_size": "50"}, "meta.json: vocab_size must be a whole number >= 0, not '50'"),
    ({"vocab_size": 40, "dtype": 5}, "meta.json: dtype must be a string, not 5"),
    ({"vocab_size": 10}, "train.bin holds token id 30 but {d}/meta.json says vocab_size = 10: the ids must be "
                         "below it"),
    ({"vocab_size": 40, "train_tokens": 150}, "train.bin holds 200 tokens but {d}/meta.json says train_tokens = 150"),
    ({"vocab_size": 40, "val_tokens": 3}, "val.bin holds 100 tokens but {d}/meta.json says val_tokens = 3"),
], ids=["a-list", "vocab-a-string", "dtype-a-number", "ids-past-the-vocabulary", "train-tokens", "val-tokens"])
def test_a_bad_meta_json_is_named(said, tokens, meta, message):
    (tokens / "meta.json").write_text(json.dumps(meta))
    line = said(["train", *TINY, "--data", tokens, "--eval-every", "1"])
    assert line.startswith(str(tokens)) and message.format(d=tokens) in line, line


@pytest.mark.parametrize("change, message", [
    (lambda c: [c], "config.json must hold a JSON object, not list"),
    (lambda c: dict(c, n_head="four"), "config.json: n_head must be a whole number >= 0, not 'four'"),
    (lambda c: dict(c, n_head=4.5), "config.json: n_head must be a whole number >= 0, not 4.5"),
    (lambda c: dict(c, tie_word_embeddings="yes"), "config.json: tie_word_embeddings must be true or false"),
    (lambda c: dict(c, layer_norm_epsilon=None), "config.json: layer_norm_epsilon must be a finite number"),
], ids=["a-list", "heads-a-word", "heads-a-fraction", "tied-a-word", "eps-null"])
def test_a_bad_config_json_is_named(said, tmp_path, solo, change, message):
    t = trainer(solo, model="tiny", layers=2, hidden=16, heads=2, seq_len=8, batch_size=4)
    export(t, tmp_path / "gpt")
    config = tmp_path / "gpt" / "config.json"
    config.write_text(json.dumps(change(json.loads(config.read_text()))))
    for command in (["train", *TINY, "--init-from", tmp_path / "gpt"], ["generate", tmp_path / "gpt"]):
        line = said(command)
        assert message in line and str(config) in line, line


def test_nan_weights_are_refused_before_the_first_step(said, tmp_path, solo):
    from safetensors.numpy import load_file, save_file
    t = trainer(solo, model="tiny", layers=2, hidden=16, heads=2, seq_len=8, batch_size=4, synthetic_vocab=32)
    export(t, tmp_path / "model.safetensors")
    weights = load_file(str(tmp_path / "model.safetensors"))
    weights["h.1.mlp.c_fc.weight"][3, 4] = np.nan
    save_file(weights, str(tmp_path / "model.safetensors"), metadata={"n_head": "2", "layer_norm_epsilon": "1e-05"})
    line = said(["train", *TINY, "--init-from", tmp_path / "model.safetensors", "--metrics", tmp_path / "m.jsonl"])
    assert line.startswith(f"--init-from: {tmp_path / 'model.safetensors'}: h.1.mlp.c_fc.weight holds NaN or inf")
    assert not (tmp_path / "m.jsonl").exists() or not (tmp_path / "m.jsonl").read_text()      # no step ran
    line = said(["generate", tmp_path / "model.safetensors", "--max-tokens", "2"])
    assert line == f"hpcpar generate: {tmp_path / 'model.safetensors'}: h.1.mlp.c_fc.weight holds NaN or inf"


@pytest.mark.parametrize("args, message", [
    (["train", *TINY, "--lr", "nan"], "argument --lr: must be a finite number, not 'nan'"),
    (["train", *TINY, "--weight-decay", "inf"], "argument --weight-decay: must be a finite number, not 'inf'"),
    (["train", *TINY, "--config", "{tmp}/run.toml::lr = nan"], "--lr must be a finite number, got nan"),
    (["train", *TINY, "--config", "{tmp}/run.toml::eps = inf"], "--eps must be a finite number, got inf"),
    (["train", *TINY, "--min-lr", "0.5"], "--min-lr 0.5 is above the peak --lr 0.01"),
    (["train", *TINY, "--capacity-factor", "nan"], "argument --capacity-factor: must be a finite number"),
    (["train", *TINY, "--seed", "-1"], "--seed must not be negative, got -1"),
    (["train", *TINY, "--skip-limit", "0"], "--skip-limit must be at least 1, got 0"),
    (["train", *TINY, "--pp", "1", "--partition", "a,b"], "--partition a,b: need 1 non-negative block counts"),
    (["train", *TINY, "--microbatches", "1000000000", "--batch-size", "1000000000"],
     "--microbatches 1000000000: a step runs at most 65,536 micro-batches per data-parallel rank"),
    (["train", *TINY, "--batch-size", "1000000000000"],
     "--batch-size 1000000000000: one micro-batch's activations need at least 953,674 GiB on a rank "
     "(2 layers x 1,000,000,000,000 x 8 x 16 numbers of 4 bytes, each layer's input alone)"),
    (["generate", "{tmp}", "--temperature", "nan"], "argument --temperature: must be a finite number, not 'nan'"),
    (["generate", "{tmp}", "--seed", "-1"], "--seed must not be negative, got -1"),
    (["plan", "--model", "gpt3-175b", "--gpus", "1000000000000", "--global-batch", "1536", "--seq-len", "2048"],
     "--gpus 1,000,000,000,000: the planner takes jobs of at most 1,048,576 GPUs"),
    (["plan", "--model", "gpt3-175b", "--gpus", "64", "--global-batch", "64", "--seq-len", "2048", "--hbm-gbps",
      "nan"], "argument --hbm-gbps: must be a finite number, not 'nan'"),
    (["grid", "--tp", "1000000", "--pp", "1000000", "--dp", "1000000", "--world", "1000000000000000000"],
     "--world 1,000,000,000,000,000,000: hpcpar grid draws maps of at most 4,096 ranks"),
    (["schedule", "--stages", "4", "--microbatches", "1000000000"],
     "--stages 4 x --microbatches 1000000000 = 4,000,000,000 forwards: hpcpar schedule draws at most 32,768"),
    (["train", *TINY, "--save", "{tmp}/a-file/ck"], "--save: cannot write to {tmp}/a-file/ck: "),
    (["train", *TINY, "--metrics", "{tmp}/a-file/m.jsonl"], "--metrics: cannot write to {tmp}/a-file: "),
], ids=["lr-nan", "weight-decay-inf", "toml-lr-nan", "toml-eps-inf", "min-lr-above-lr", "capacity-nan", "seed",
        "skip-limit", "partition-words", "microbatches", "micro-batch-memory", "temperature-nan", "generate-seed",
        "plan-gpus", "plan-hbm-nan", "grid-world", "schedule-microbatches", "save-unwritable", "metrics-unwritable"])
def test_every_number_and_output_is_checked_before_the_first_step(said, tmp_path, args, message):
    (tmp_path / "a-file").write_text("a file, not a directory")
    args = [a.format(tmp=tmp_path) for a in args]
    if "::" in "".join(args):
        i = next(i for i, a in enumerate(args) if "::" in a)
        path, text = args[i].split("::")
        Path(path).write_text(text + "\n")
        args[i] = path
    line = said(args)
    assert message.format(tmp=tmp_path) in line, line


def test_a_larger_tokenizer_than_the_model_is_refused(said, tmp_path, solo):
    pytest.importorskip("tokenizers")
    from hpcpar.training.text import train_tokenizer
    t = trainer(solo, model="tiny", layers=2, hidden=16, heads=2, seq_len=8, batch_size=4)
    export(t, tmp_path / "gpt")
    (tmp_path / "tokenizer.json").write_text(train_tokenizer(["some text " * 50], 300).to_str())
    line = said(["generate", tmp_path / "gpt", "--tokenizer", tmp_path / "tokenizer.json", "--max-tokens", "2"])
    assert line.startswith(f"--tokenizer: the tokenizer {tmp_path / 'tokenizer.json'} has 2") and \
        "the model's vocabulary is 29" in line, line


@pytest.mark.parametrize("swap", ["corrupt", "larger"])
def test_a_tokenizer_export_would_copy_is_checked_before_the_first_step(said, tmp_path, swap):
    pytest.importorskip("tokenizers")
    from hpcpar.training.text import prepare, train_tokenizer
    text = "Some text that repeats, with a few words.\n" * 60
    (tmp_path / "t.txt").write_text(text)
    vocab = prepare([tmp_path / "t.txt"], tmp_path / "data", vocab_size=300, seq_len=8, progress=False)["vocab_size"]
    tokenizer = tmp_path / "data" / "tokenizer.json"
    if swap == "corrupt":
        tokenizer.write_text(tokenizer.read_text()[:100])          # a copy cut short
    else:                                                           # another text's, with more tokens
        other = train_tokenizer([text, "other words altogether, quite unlike the rest " * 40], 400)
        tokenizer.write_text(other.to_str())
        assert other.get_vocab_size() > vocab
    line = said(["train", *TINY, "--data", tmp_path / "data", "--export", tmp_path / "out", "--save",
                 tmp_path / "ck"])
    assert line.startswith(f"cannot load the tokenizer {tokenizer}: " if swap == "corrupt" else
                           f"--export {tmp_path / 'out'}: the tokenizer {tokenizer} has {other.get_vocab_size()} "
                           f"tokens but the model's vocabulary is {vocab}"), line
    assert not (tmp_path / "out").exists() and not (tmp_path / "ck").exists()


def test_a_full_disk_under_metrics_is_one_sentence(said):
    line = said(["train", *TINY, "--metrics", "/dev/full"], status=1)
    assert line == "hpcpar: error on rank 0: cannot write --metrics /dev/full: No space left on device"


def test_skipped_steps_end_the_run_after_the_limit(said, tmp_path):
    line = said(["train", *TINY, "--steps", "30", "--lr", "1e30", "--nonfinite", "skip", "--skip-limit", "3",
                 "--save", tmp_path / "ck"], status=1)
    assert line == ("hpcpar: non-finite loss or gradient in 3 steps in a row (2 to 4; --skip-limit 3): stopping "
                    "(the weights are those of step 1)")
    assert (tmp_path / "ck" / "latest").read_text() == "step-00000001\n"


@pytest.mark.mpi(min_size=2)
def test_ids_past_the_vocabulary_are_refused_on_every_tensor_parallel_rank(comm, tmp_path_factory, capfd):
    """Under --tp 2 such an id trained to exit 0 on one rank's half of the embedding and was an IndexError
    on the other's: now every rank refuses it before the first step."""
    if comm.size != 2:
        pytest.skip("tp 2")
    d = Path(comm.bcast(str(tmp_path_factory.mktemp("tokens")) if comm.rank == 0 else None, root=0))
    if comm.rank == 0:
        np.arange(200, dtype=np.uint16).__mod__(31).astype(np.uint16).tofile(d / "train.bin")
        (d / "meta.json").write_text(json.dumps({"vocab_size": 20, "dtype": "uint16"}))
    comm.Barrier()
    status, err = in_process(capfd, ["train", *TINY, "--tp", "2", "--data", d])
    assert status == 2 and "Traceback" not in err
    if comm.rank == 0:
        assert err.strip() == (f"hpcpar: error: {d / 'train.bin'} holds token id 30 but {d / 'meta.json'} says "
                               f"vocab_size = 20: the ids must be below it (a meta.json of other data?)")


def test_generate_from_a_checkpoint_converted_from_weights_is_one_line(said, tmp_path, solo):
    """Such a checkpoint records no model options: a KeyError '' before, now the way to go."""
    from hpcpar.checkpoint.convert import convert
    export(trainer(solo, model="tiny", layers=2, hidden=16, heads=2, seq_len=8), tmp_path / "w.safetensors")
    convert(tmp_path / "w.safetensors", tmp_path / "ck")
    line = said(["generate", tmp_path / "ck", "--max-tokens", "2"])
    assert line == (f"hpcpar generate: {tmp_path / 'ck' / 'step-00000000'} does not record its model (a checkpoint "
                    f"converted from weights): generate from the weights file itself")
