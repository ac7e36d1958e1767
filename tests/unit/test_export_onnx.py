"""scripts/export_onnx.py: the exported graph against the served config and against PyTorch, and the
refusal to leave behind a model that failed verification."""
from __future__ import annotations

import os
import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from clients.model_spec import load_spec, spec_from_config
from scripts import export_onnx

MODEL_NAME = "minilm"

# Not the verification text, so the agreement below is checked on inputs the export never saw.
FRESH_TEXTS = [
    "Where is the nearest train station?",
    "Batching requests trades a little latency for a lot of throughput on a busy server.",
    "ok",
    "The quick brown fox jumps over the lazy dog, and then it runs back into the forest again.",
]


@pytest.fixture(scope="module")
def model_dir():
    return export_onnx.default_model_dir()


@pytest.fixture(scope="module")
def exported(tmp_path_factory, model_dir):
    output = tmp_path_factory.mktemp("export") / "model.onnx"
    export_onnx.export(model_dir, output, log=lambda line: None)
    return output


@pytest.fixture(scope="module")
def session(exported):
    return ort.InferenceSession(str(exported), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def encoder(model_dir):
    return export_onnx.load_encoder(model_dir)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return export_onnx.load_tokenizer(model_dir)


def _embed(session, batch) -> np.ndarray:
    (embedding,) = session.run(None, batch)
    return embedding


def _dims(value_info) -> tuple[int, ...]:
    """A graph tensor's shape with every symbolic (dynamic) dimension written as -1."""
    return tuple(-1 if d.dim_param else d.dim_value for d in value_info.type.tensor_type.shape.dim)


def _interface(values) -> dict[str, tuple[type, tuple[int, ...]]]:
    """Graph tensors as name -> (numpy dtype, dims), the way the served config describes them."""
    return {v.name: (onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).type, _dims(v))
            for v in values}


def test_graph_interface_matches_served_config(exported):
    spec = load_spec(MODEL_NAME)
    graph = onnx.load(str(exported)).graph
    # The config leaves out the batch dimension (max_batch_size > 0); the graph has it, dynamic.
    assert _interface(graph.input) == {t.name: (t.numpy_dtype, (-1, *t.dims)) for t in spec.inputs}
    assert _interface(graph.output) == {t.name: (t.numpy_dtype, (-1, *t.dims)) for t in spec.outputs}


def test_tokenizer_is_copied_next_to_model(exported, model_dir):
    assert (exported.parent / "tokenizer.json").read_bytes() == (model_dir / "tokenizer.json").read_bytes()


def test_onnx_matches_pytorch_on_fresh_batch_with_unit_norm(session, encoder, tokenizer):
    batch = export_onnx.tokenize(tokenizer, FRESH_TEXTS)
    assert batch["attention_mask"].min() == 0  # the batch really has padded rows

    actual = _embed(session, batch)
    with torch.inference_mode():
        expected = encoder(*(torch.from_numpy(batch[name]) for name in export_onnx.ENCODER_ARGS)).numpy()

    assert actual.shape == (len(FRESH_TEXTS), encoder.hidden_size)
    assert np.max(np.abs(actual - expected)) <= 1e-4
    np.testing.assert_allclose(np.linalg.norm(actual, axis=1), 1.0, atol=1e-5)


def test_embedding_does_not_depend_on_padding(session, tokenizer):
    short, long = FRESH_TEXTS[0], FRESH_TEXTS[3]
    alone = _embed(session, export_onnx.tokenize(tokenizer, [short]))
    batch = export_onnx.tokenize(tokenizer, [short, long])
    assert batch["attention_mask"][0].sum() < batch["attention_mask"].shape[1]  # short row is padded

    batched = _embed(session, batch)
    # Not exact equality: the batch shape changes how the matmuls accumulate a row's sums.
    np.testing.assert_allclose(batched[0], alone[0], rtol=0, atol=1e-5)


def test_export_refuses_model_that_fails_verification(tmp_path, monkeypatch, capsys):
    real_verify = export_onnx.verify

    def verify_against_perturbed_weights(onnx_path, module, tokenizer, atol, log=print):
        # The graph was exported from the unperturbed weights, so every case must disagree.
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for parameter in module.parameters():
                parameter.add_(1e-2 * torch.randn(parameter.shape, generator=generator))
        return real_verify(onnx_path, module, tokenizer, atol, log=log)

    monkeypatch.setattr(export_onnx, "verify", verify_against_perturbed_weights)
    destination = tmp_path / "1"
    destination.mkdir()

    exit_code = export_onnx.main(["--output", str(destination / "model.onnx")])

    assert exit_code != 0
    out, err = capsys.readouterr()
    assert "FAIL" in out
    assert "more than atol=0.0001" in err and "batch 1, lengths 1" in err
    assert list(destination.iterdir()) == []  # neither the model, its temp file nor the tokenizer


def test_failed_write_keeps_previous_file_and_leaves_no_temp_file(tmp_path):
    destination = tmp_path / "model.onnx"
    destination.write_bytes(b"previous model")

    def write_then_fail(tmp):
        tmp.write_bytes(b"half-written model")
        raise export_onnx.VerificationError([("batch 1, lengths 1", 0.5)], atol=1e-4)

    with pytest.raises(export_onnx.VerificationError, match=re.escape("batch 1, lengths 1: max |diff| 0.5")):
        export_onnx._replace_atomically(write_then_fail, destination)
    assert destination.read_bytes() == b"previous model"
    assert list(tmp_path.iterdir()) == [destination]


def test_check_spec_refuses_hidden_size_that_differs_from_config():
    config = type(load_spec(MODEL_NAME).config)()
    config.CopyFrom(load_spec(MODEL_NAME).config)  # load_spec is cached: never edit its result
    config.output[0].dims[:] = [768]
    spec = spec_from_config(config, MODEL_NAME)

    with pytest.raises(export_onnx.ExportError, match=r"dims \[768\].*hidden size is 384"):
        export_onnx.check_spec(spec, hidden_size=384)
    export_onnx.check_spec(load_spec(MODEL_NAME), hidden_size=384)


def test_is_current_compares_outputs_with_newest_source(tmp_path, model_dir):
    output = tmp_path / "1" / "model.onnx"
    config_path = tmp_path / "config.pbtxt"
    config_path.write_text("")
    assert not export_onnx.is_current(model_dir, output, config_path)  # nothing exported yet

    output.parent.mkdir()
    output.write_bytes(b"model")
    (output.parent / "tokenizer.json").write_text("{}")
    earlier = output.stat().st_mtime - 10
    os.utime(config_path, (earlier, earlier))
    assert export_onnx.is_current(model_dir, output, config_path)

    later = output.stat().st_mtime + 10
    os.utime(config_path, (later, later))  # the config changed after the export
    assert not export_onnx.is_current(model_dir, output, config_path)
