"""Turns the requests of one dynamic batch into one set of input arrays and splits the outputs back.

Requests whose variable dims differ (allowed when an input has `allow_ragged_batch`) are padded with
zeros to the batch's longest; for a BERT-style encoder a zero attention mask keeps padded positions
out of the result. Pure numpy, no Triton imports.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ort_config import OrtModelConfig


class RequestError(ValueError):
    """One request is malformed; it alone fails, the rest of the batch runs."""


@dataclass(frozen=True)
class RequestInputs:
    arrays: dict[str, np.ndarray]  # input name -> array, with the batch dim when the model batches
    batch_size: int


def validate_request(config: OrtModelConfig, arrays: dict[str, np.ndarray | None]) -> RequestInputs:
    """Check one request's inputs against the config; raise RequestError naming the input."""
    checked: dict[str, np.ndarray] = {}
    batch_sizes = set()
    for spec in config.inputs:
        array = arrays.get(spec.name)
        if array is None:
            raise RequestError(f"missing input {spec.name!r}; the model expects {[t.name for t in config.inputs]}")
        if array.dtype != spec.numpy_dtype:
            raise RequestError(
                f"input {spec.name!r} has dtype {array.dtype}, expected {np.dtype(spec.numpy_dtype)} ({spec.data_type})"
            )
        inner = array.shape[1:] if config.is_batching else array.shape
        if len(inner) != len(spec.dims) or any(d != -1 and d != s for d, s in zip(spec.dims, inner)):
            expected = ([-1] if config.is_batching else []) + list(spec.dims)
            raise RequestError(f"input {spec.name!r} has shape {list(array.shape)}, expected {expected}")
        if config.is_batching:
            batch_sizes.add(array.shape[0])
        checked[spec.name] = array
    unknown = sorted(set(arrays) - set(checked))
    if unknown:
        raise RequestError(f"unknown input(s) {unknown}; the model expects {[t.name for t in config.inputs]}")
    if not config.is_batching:
        return RequestInputs(checked, 1)
    if len(batch_sizes) != 1:
        raise RequestError(f"inputs disagree on the batch size: {_shapes(checked)}")
    batch_size = batch_sizes.pop()
    if batch_size == 0:
        raise RequestError("empty batch: the inputs have batch size 0")
    if batch_size > config.max_batch_size:
        raise RequestError(f"batch size {batch_size} is above max_batch_size {config.max_batch_size}")
    _check_variable_dims_agree(config, checked)
    return RequestInputs(checked, batch_size)


def _shapes(arrays: dict[str, np.ndarray]) -> str:
    return ", ".join(f"{name} {list(a.shape)}" for name, a in arrays.items())


def _check_variable_dims_agree(config: OrtModelConfig, arrays: dict[str, np.ndarray]) -> None:
    """Inputs whose variable dims have the same position (token ids and their mask) must agree on
    them within one request; padding can't repair a mask shorter than its ids."""
    ranks = {len(spec.dims) for spec in config.inputs}
    if len(ranks) != 1:
        return
    for axis in range(ranks.pop()):
        variable = [spec.name for spec in config.inputs if spec.dims[axis] == -1]
        lengths = {arrays[name].shape[1 + axis] for name in variable}
        if len(lengths) > 1:
            raise RequestError(
                f"inputs {variable} must have the same length along dim {1 + axis}: "
                + _shapes({n: arrays[n] for n in variable})
            )


def merge(config: OrtModelConfig, requests: list[RequestInputs]) -> dict[str, np.ndarray]:
    """Concatenate the requests along the batch dim, zero-padding variable dims to the longest."""
    # [sum(batch_size), *max(dims)] per input
    merged = {}
    for spec in config.inputs:
        parts = [r.arrays[spec.name] for r in requests]
        target = tuple(max(p.shape[axis] for p in parts) for axis in range(1, parts[0].ndim))
        padded = [_pad_to(p, target) for p in parts]
        merged[spec.name] = padded[0] if len(padded) == 1 else np.concatenate(padded, axis=0)
    return merged


def _pad_to(array: np.ndarray, inner_shape: tuple[int, ...]) -> np.ndarray:
    if array.shape[1:] == inner_shape:
        return array
    widths = [(0, 0)] + [(0, t - s) for s, t in zip(array.shape[1:], inner_shape)]
    return np.pad(array, widths, mode="constant", constant_values=0)


def padding_fraction(requests: list[RequestInputs], merged: dict[str, np.ndarray]) -> float:
    """Share of the merged first input that is padding: the compute that ragged batching wastes."""
    name = next(iter(merged))
    real = sum(r.arrays[name].size for r in requests)
    total = merged[name].size
    return 0.0 if total == 0 else 1.0 - real / total


def split(outputs: dict[str, np.ndarray], requests: list[RequestInputs]) -> list[dict[str, np.ndarray]]:
    """Give each request its own rows of every output, in request order."""
    bounds = np.cumsum([0] + [r.batch_size for r in requests])
    total = int(bounds[-1])
    for name, array in outputs.items():
        if array.shape[0] != total:
            raise RuntimeError(f"output {name!r} has {array.shape[0]} rows for a batch of {total}")
    return [{name: array[bounds[i] : bounds[i + 1]] for name, array in outputs.items()} for i in range(len(requests))]
