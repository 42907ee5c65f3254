"""Sample text from a trained GPT-2, Llama (with experts: Mixtral, Qwen3-MoE) or DeepSeek-V3: a checkpoint, an
--export, or Hugging Face weights (one rank).  After the text, the KV cache's bytes per token go to stderr.

  hpcpar generate runs/ck --prompt "Alice was" --max-tokens 60
  hpcpar generate runs/export --temperature 0.8 --top-k 40 --seed 1
  hpcpar generate runs/export --temperature 0 --max-tokens 20       # greedy: always the likeliest token

The text is decoded with the tokenizer saved with the model (the tokenizer.json of an export, or of
the data directory a checkpoint was trained on); --tokenizer names another one.  Without a tokenizer
the token ids are printed.
"""
from hpcpar.cli import finite

HELP = "sample text from a trained model (KV cache, one rank)"


def add_arguments(p):
    p.add_argument("model", help="checkpoint directory, --export directory or .safetensors, or a Hugging Face "
                                 "GPT-2, Llama, Mixtral, Qwen3-MoE or DeepSeek-V3 save_pretrained directory")
    p.add_argument("--prompt", default=None, help="text to continue (default: the end-of-text token)")
    p.add_argument("--max-tokens", type=int, default=100, help="tokens to generate (default: 100)")
    p.add_argument("--temperature", type=finite, default=1.0, help="0: greedy; < 1 sharper, > 1 flatter "
                                                                  "(default: 1.0)")
    p.add_argument("--top-k", type=int, default=0, help="sample from the k likeliest tokens only (0: all)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling (default: 0)")
    p.add_argument("--tokenizer", default=None, help="tokenizer.json to encode the prompt and decode with")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"], help="arithmetic (default: float32)")
    p.add_argument("--documents", action="store_true", help="the model attends within documents (hpcpar train "
                                                             "--documents; a checkpoint says so itself): read the "
                                                             "prompt's last document only, stop at <|endoftext|>")


def run(args):
    from hpcpar.checkpoint.files import CheckpointError
    from hpcpar.runtime import UsageError
    try:
        return _generate(args)
    except CheckpointError as err:         # a damaged, altered or poisoned file the user named: bad input
        raise UsageError(f"hpcpar generate: {err}") from None


def _generate(args):
    from hpcpar.runtime import UsageError
    from hpcpar.training.text import EOT, model_tokenizer
    from mpi4py import MPI
    if MPI.COMM_WORLD.size > 1:
        raise UsageError(f"hpcpar generate runs on one rank, not {MPI.COMM_WORLD.size}")
    for name in ("max_tokens", "top_k", "seed"):
        if getattr(args, name) < 0:
            raise UsageError(f"--{name.replace('_', '-')} must not be negative, got {getattr(args, name)}")
    if not args.temperature >= 0:
        raise UsageError(f"--temperature must not be negative, got {args.temperature}")
    import sys

    from hpcpar.training.generate import cache_report, generate, load_model
    model, saved = load_model(args.model, args.dtype)
    tok = model_tokenizer(args.tokenizer or saved, model.cfg.vocab_size, "--tokenizer" if args.tokenizer else
                          f"the tokenizer saved with {args.model}") if (args.tokenizer or saved) else None
    if tok is None:
        if args.prompt is not None:
            raise UsageError(f"{args.model} has no saved tokenizer to encode --prompt: give --tokenizer")
        prompt = [0]
    elif args.prompt is None:
        prompt = [tok.token_to_id(EOT) or 0]
    else:
        prompt = tok.encode(args.prompt).ids
    separator = tok.token_to_id(EOT) if tok is not None and (args.documents or model.documents) else None
    ids = generate(model, prompt, args.max_tokens, args.temperature, args.top_k, args.seed, separator)
    print(cache_report(model.cfg, model.embed.wte.data.itemsize), file=sys.stderr)
    if tok is None:
        print(" ".join(map(str, ids)))
    else:
        print(tok.decode(ids if args.prompt is not None else ids[1:]))
    return 0
