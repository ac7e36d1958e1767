"""Write the GPT-2 checkpoint directory that the `gpt2` models serve: seeded random weights at a chosen
shape (default distilgpt2's), or a copy of a local Hugging Face GPT-2 checkpoint. Never downloads.

Run from the repository root: `python scripts/make_decoder_weights.py`. Random weights use the
all-MiniLM-L6-v2 WordPiece vocabulary, so that text goes in and comes out; their eos (and bos) is the
tokenizer's [SEP].
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

if __package__ in (None, ""):
    # Run as a file, Python puts scripts/ on sys.path instead of the repository root.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clients.model_spec import MODEL_REPOSITORY  # noqa: E402
from scripts.export_onnx import default_model_dir  # noqa: E402

DEFAULT_OUTPUT = MODEL_REPOSITORY / "gpt2" / "1"
EOS_TOKEN = "[SEP]"  # the WordPiece vocabulary has no <|endoftext|>; [SEP] ends a segment in BERT too
RECIPE_FILE = "weights_recipe.json"  # how the files were made; --skip-if-current compares it
# Everything this script writes; stale copies of these are removed, other files are left alone.
OUTPUT_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", RECIPE_FILE)


class WeightsScriptError(Exception):
    pass


@dataclass(frozen=True)
class RandomShape:
    n_layer: int = 6
    n_embd: int = 768
    n_head: int = 12
    n_positions: int = 1024
    vocab_size: int | None = None  # None: the tokenizer's vocabulary size

    def __post_init__(self):
        for name, value in asdict(self).items():
            if value is not None and (not isinstance(value, int) or value < 1):
                raise WeightsScriptError(f"{name}: must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head:
            raise WeightsScriptError(f"n_embd: {self.n_embd} is not divisible by n_head={self.n_head}")


def decoder_tokenizer_json() -> str:
    """The MiniLM tokenizer, made fit for a decoder: no [CLS]/[SEP] around every prompt (a prompt
    ending in [SEP] would end in eos), no padding to 128 and no truncation (the engine bounds lengths)."""
    spec = json.loads((default_model_dir() / "tokenizer.json").read_text())
    spec.update(post_processor=None, padding=None, truncation=None)
    return json.dumps(spec, ensure_ascii=False, indent=2)


def random_recipe(shape: RandomShape, seed: int) -> dict:
    from tokenizers import Tokenizer

    vocab_size = shape.vocab_size or Tokenizer.from_str(decoder_tokenizer_json()).get_vocab_size()
    return {"source": "random", "seed": seed, **asdict(shape), "vocab_size": vocab_size}


def checkpoint_recipe(source: Path) -> dict:
    newest_mtime = max((p.stat().st_mtime for p in Path(source).iterdir() if p.is_file()), default=0.0)
    return {"source": str(Path(source).resolve()), "source_mtime": newest_mtime}


def make_random_checkpoint(
    output: Path, shape: RandomShape = RandomShape(), seed: int = 0, log=print
) -> Path:
    """GPT-2's own initialisation (normal std 0.02, residual projections scaled by 1/sqrt(2 n_layer),
    LayerNorm 1 and 0), done by transformers so that GPT2LMHeadModel.from_pretrained loads it as is."""
    import torch
    from tokenizers import Tokenizer
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer_json = decoder_tokenizer_json()
    tokenizer = Tokenizer.from_str(tokenizer_json)
    eos_id = tokenizer.token_to_id(EOS_TOKEN)
    vocab_size = shape.vocab_size or tokenizer.get_vocab_size()
    if vocab_size != tokenizer.get_vocab_size():
        # Token ids past a smaller vocabulary would have no embedding; tests use such small models.
        log(f"vocab_size {vocab_size} differs from the tokenizer's {tokenizer.get_vocab_size()}: "
            "writing no tokenizer.json")
        tokenizer_json = None
    if eos_id >= vocab_size:
        eos_id = vocab_size - 1
    config = GPT2Config(
        n_layer=shape.n_layer, n_embd=shape.n_embd, n_head=shape.n_head, n_positions=shape.n_positions,
        vocab_size=vocab_size, bos_token_id=eos_id, eos_token_id=eos_id, activation_function="gelu_new",
    )
    log(f"initialising a random GPT-2 (seed {seed}): {shape.n_layer} layers, {shape.n_embd} hidden, "
        f"{shape.n_head} heads, {shape.n_positions} positions, vocab {vocab_size}, eos id {eos_id}")
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config).eval()
    return _write(output, model, tokenizer_json, random_recipe(shape, seed), log)


def copy_checkpoint(source: Path, output: Path, log=print) -> Path:
    """Re-saves a local checkpoint (safetensors or pytorch_model.bin) as safetensors, with its tokenizer."""
    source = Path(source)
    config_path = source / "config.json"
    if not config_path.is_file():
        raise WeightsScriptError(f"{source}: no config.json; not a Hugging Face checkpoint directory")
    model_type = json.loads(config_path.read_text()).get("model_type")
    if model_type != "gpt2":
        raise WeightsScriptError(f"{config_path}: model_type is {model_type!r}, this engine runs 'gpt2'")
    os.environ["HF_HUB_OFFLINE"] = "1"  # a missing file must fail here, never turn into a download
    from transformers import GPT2LMHeadModel

    log(f"loading {source}")
    model = GPT2LMHeadModel.from_pretrained(source, local_files_only=True).eval()
    tokenizer_path = source / "tokenizer.json"
    tokenizer_json = tokenizer_path.read_text() if tokenizer_path.is_file() else None
    if tokenizer_json is None:
        log(f"{source} has no tokenizer.json: the served model will take token ids only")
    return _write(output, model, tokenizer_json, checkpoint_recipe(source), log)


def _write(output: Path, model, tokenizer_json: str | None, recipe: dict, log) -> Path:
    """Saves into a temporary folder beside output, then moves the files in; the recipe goes last, so
    an interrupted run never looks current."""
    output.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=output.parent, prefix=f".{output.name}-"))
    try:
        model.save_pretrained(staging)  # safetensors, tied lm_head left out as GPT2LMHeadModel does
        if tokenizer_json is not None:
            (staging / "tokenizer.json").write_text(tokenizer_json)
        (staging / RECIPE_FILE).write_text(json.dumps(recipe, indent=2) + "\n")
        for name in OUTPUT_FILES:
            if name != RECIPE_FILE:
                _move_or_remove(staging / name, output / name)
        _move_or_remove(staging / RECIPE_FILE, output / RECIPE_FILE)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    size_mib = sum((output / n).stat().st_size for n in OUTPUT_FILES if (output / n).exists()) / 2**20
    log(f"wrote {output} ({size_mib:.1f} MiB)")
    return output


def _move_or_remove(staged: Path, dest: Path) -> None:
    if staged.exists():
        os.chmod(staged, 0o644)  # the server may run as another user
        os.replace(staged, dest)
    else:
        dest.unlink(missing_ok=True)  # e.g. a tokenizer.json from an earlier, different vocabulary


def is_current(output: Path, recipe: dict) -> bool:
    """True when the weights exist and the recipe written with them is the one asked for."""
    made = [output / name for name in (RECIPE_FILE, "model.safetensors", "config.json")]
    return all(p.is_file() for p in made) and json.loads(made[0].read_text()) == recipe


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    defaults = RandomShape()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--output", type=Path, default=DEFAULT_OUTPUT)
    add("--from-checkpoint", type=Path, help="local Hugging Face GPT-2 directory to copy instead")
    add("--seed", type=int, default=0)
    add("--n-layer", type=int, default=defaults.n_layer)
    add("--n-embd", type=int, default=defaults.n_embd)
    add("--n-head", type=int, default=defaults.n_head)
    add("--n-positions", type=int, default=defaults.n_positions)
    add("--vocab-size", type=int, help="default: the tokenizer's (30522); another size writes no tokenizer")
    add("--skip-if-current", action="store_true", help="skip if the output was made the same way")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    started = time.perf_counter()
    try:
        if args.from_checkpoint:
            recipe = checkpoint_recipe(args.from_checkpoint)
        else:
            shape = RandomShape(args.n_layer, args.n_embd, args.n_head, args.n_positions, args.vocab_size)
            recipe = random_recipe(shape, args.seed)
        if args.skip_if_current and is_current(args.output, recipe):
            print(f"{args.output} was made the same way; skipping")
            return 0
        if args.from_checkpoint:
            copy_checkpoint(args.from_checkpoint, args.output)
        else:
            make_random_checkpoint(args.output, shape, args.seed)
    except (WeightsScriptError, FileNotFoundError, OSError) as error:
        print(f"make_decoder_weights: error: {error}", file=sys.stderr)
        return 1
    print(f"done in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
