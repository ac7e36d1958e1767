"""Configuration variants of a model, rendered whole into a temporary model repository.

The checked-in config.pbtxt is parsed, changed as a protobuf message, and written out complete next
to links to the original version folders; the checked-in files are never edited."""
from __future__ import annotations

from pathlib import Path

from tritonclient.grpc import model_config_pb2

from clients.model_spec import MODEL_REPOSITORY, parse_config, render_config


def load_config(model: str, repository: Path = MODEL_REPOSITORY) -> model_config_pb2.ModelConfig:
    return parse_config((Path(repository) / model / "config.pbtxt").read_text())


def without_batching(config: model_config_pb2.ModelConfig) -> model_config_pb2.ModelConfig:
    """The same model with `max_batch_size: 0`: no dynamic batcher, and the batch dimension moves
    into each tensor's dims, so every request runs on its own."""
    variant = model_config_pb2.ModelConfig()
    variant.CopyFrom(config)
    variant.max_batch_size = 0
    variant.ClearField("dynamic_batching")
    for tensor in list(variant.input) + list(variant.output):
        dims = [-1, *tensor.dims]
        del tensor.dims[:]
        tensor.dims.extend(dims)
    return variant


def with_batching(config: model_config_pb2.ModelConfig, *, max_batch_size: int | None = None,
                  preferred_batch_sizes: list[int] | None = None, max_queue_delay_us: int | None = None,
                  instance_count: int | None = None) -> model_config_pb2.ModelConfig:
    variant = model_config_pb2.ModelConfig()
    variant.CopyFrom(config)
    if max_batch_size is not None:
        variant.max_batch_size = max_batch_size
    if preferred_batch_sizes is not None:
        del variant.dynamic_batching.preferred_batch_size[:]
        variant.dynamic_batching.preferred_batch_size.extend(preferred_batch_sizes)
    if max_queue_delay_us is not None:
        variant.dynamic_batching.max_queue_delay_microseconds = max_queue_delay_us
    if instance_count is not None:
        for group in variant.instance_group:
            group.count = instance_count
    return variant


def write_repository(dest: Path, configs: dict[str, model_config_pb2.ModelConfig],
                     source: Path = MODEL_REPOSITORY) -> Path:
    """A model repository at `dest` serving `configs` ({served name: config}); each config's
    version folders are links to those of the model it was made from (config.name)."""
    dest = Path(dest)
    for served_name, config in configs.items():
        origin = Path(source) / config.name
        model_dir = dest / served_name
        model_dir.mkdir(parents=True)
        rendered = model_config_pb2.ModelConfig()
        rendered.CopyFrom(config)
        rendered.name = served_name
        (model_dir / "config.pbtxt").write_text(render_config(rendered))
        for version in origin.iterdir():
            if version.is_dir() and version.name.isdigit():
                (model_dir / version.name).symlink_to(version.resolve(), target_is_directory=True)
    return dest
