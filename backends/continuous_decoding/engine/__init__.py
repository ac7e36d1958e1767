"""The continuous-decoding engine: no Triton, no network; unit-tested on the CPU.

Dependencies run one way: sequence <- block_manager <- scheduler; runner knows only the packed
batch; engine wires scheduler, runner and sampler."""
