"""The sequence-length search and the memory ordering that bench_seq.py reports."""

from colossal_jax_benchmarks.seqbench import candidates, layer_memory_bytes, longest_sequence


def test_longest_sequence_binary_search():
    calls = []

    def fits(s):
        calls.append(s)
        return s * s <= 5_000_000  # longest multiple of 16 with s² ≤ 5e6 is 2224

    assert longest_sequence(fits, 16) == 2224
    assert all(s % 16 == 0 for s in calls)
    assert longest_sequence(lambda s: False, 16) == 0


def test_ring_holds_eight_times_the_sequence_in_less_memory_than_one_device():
    by = {c.name.split()[0].rstrip(","): c for c in candidates(8)}
    one = layer_memory_bytes(by["one"], 256, hidden=64, heads=8)
    ring = layer_memory_bytes(by["ring"], 8 * 256, hidden=64, heads=8)
    tensor = layer_memory_bytes(by["1d"], 8 * 256, hidden=64, heads=8)
    assert ring <= 1.1 * one < tensor


def test_the_blockwise_kernel_holds_a_long_sequence_in_a_fraction_of_the_memory():
    by = {c.name.split()[0].rstrip(","): c for c in candidates(8)}
    one = layer_memory_bytes(by["one"], 2048, hidden=64, heads=8)
    blockwise = layer_memory_bytes(by["blockwise"], 2048, hidden=64, heads=8)
    scores = 4 * 8 * 2048 * 2048  # one fp32 score matrix of the layer
    assert one > scores > 2 * blockwise, (one, scores, blockwise)
