"""The variants a config sweep measures: every combination of the values given per setting, each one
rendered from the checked-in config as a whole message (scripts/variants.py), never edited in place.
Combinations that Triton or the engine would refuse are skipped up front, with the reason."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2

from backends.continuous_decoding.engine.config import ConfigError, EngineConfig
from scripts.variants import with_batching, without_batching

DECODING_BACKEND = "continuous_decoding"
# (option, short label for variant names); batcher options for Triton's dynamic batcher, engine
# options for the decoding backend's `parameters`.
BATCHER_OPTIONS = (("max_batch_size", "mbs"), ("preferred_batch_sizes", "pref"), ("batch_window_us", "win"))
ENGINE_OPTIONS = (("scheduling", ""), ("max_num_seqs", "seqs"), ("max_num_batched_tokens", "tok"))


@dataclass(frozen=True)
class Variant:
    name: str
    settings: dict  # only what differs from the checked-in config
    config: model_config_pb2.ModelConfig


def with_engine_parameters(config: model_config_pb2.ModelConfig, **values) -> model_config_pb2.ModelConfig:
    variant = model_config_pb2.ModelConfig()
    variant.CopyFrom(config)
    for key, value in values.items():
        variant.parameters[key].string_value = str(value)
    return variant


def _label(option: str, short: str, value) -> str:
    if isinstance(value, list):
        value = "-".join(map(str, value)) or "none"
    return f"{short}{value}"


def _problem(config: model_config_pb2.ModelConfig) -> str | None:
    """Why Triton or the engine would refuse this config, or None."""
    if config.backend == DECODING_BACKEND:
        try:
            EngineConfig.from_parameters({k: v.string_value for k, v in config.parameters.items()})
        except ConfigError as e:
            return str(e)
        return None
    too_big = [b for b in config.dynamic_batching.preferred_batch_size if b > config.max_batch_size]
    if too_big:
        return f"preferred batch sizes {too_big} exceed max_batch_size {config.max_batch_size}"
    return None


def variant_grid(config: model_config_pb2.ModelConfig, model: str, **options) -> tuple[list[Variant], list[str]]:
    """Variants for every combination of the given options (None or [] leaves a setting as checked
    in), and the reasons for the combinations skipped. Options that do not apply to the model's
    kind of batching raise ValueError naming the flag."""
    is_decoding = config.backend == DECODING_BACKEND
    own, other = (ENGINE_OPTIONS, BATCHER_OPTIONS) if is_decoding else (BATCHER_OPTIONS, ENGINE_OPTIONS)
    for option, _ in other:
        if options.get(option):
            kind = "batches in its engine" if is_decoding else "uses Triton's dynamic batcher"
            raise ValueError(f"{model} {kind}: --{option.replace('_', '-')} does not apply to it")
    axes = [(option, short, options[option]) for option, short in own + (("instances", "inst"),)
            if options.get(option)]
    variants, skipped = [], []
    for values in itertools.product(*(vals for _, _, vals in axes)):
        settings = {option: value for (option, _, _), value in zip(axes, values)}
        name = "_".join(_label(option, short, v) for (option, short, _), v in zip(axes, values)) or "checked_in"
        engine = {k: v for k, v in settings.items() if k in dict(ENGINE_OPTIONS)}
        if settings.get("max_batch_size") == 0:
            # Batching off: no dynamic batcher, the batch axis moves into the tensors' dims.
            if settings.get("preferred_batch_sizes") or settings.get("batch_window_us"):
                skipped.append(f"{name}: max_batch_size 0 turns the dynamic batcher off, so it has no "
                               "preferred sizes or window")
                continue
            rendered = with_batching(without_batching(config), instance_count=settings.get("instances"))
        else:
            rendered = with_batching(
                with_engine_parameters(config, **engine) if engine else config,
                max_batch_size=settings.get("max_batch_size"),
                preferred_batch_sizes=settings.get("preferred_batch_sizes"),
                max_queue_delay_us=settings.get("batch_window_us"), instance_count=settings.get("instances"))
        if (problem := _problem(rendered)) is not None:
            skipped.append(f"{name}: {problem}")
            continue
        variants.append(Variant(name, settings, rendered))
    if not variants:
        raise ValueError("no variant left to run: " + "; ".join(skipped))
    return variants, skipped
