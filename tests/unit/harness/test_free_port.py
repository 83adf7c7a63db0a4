"""The harness hands out each port once: the kernel may give one ephemeral port to two binds in
a row (a stack start once gave Triton the same port for HTTP and gRPC and failed)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.errors import ServiceFailed
from harness.proc import free_port


def kernel(ports: list[int]) -> Iterator[int]:
    yield from ports


def test_a_port_the_kernel_gives_again_is_not_handed_out_twice() -> None:
    given = kernel([41_001, 41_001, 41_001, 41_002])
    first = free_port(lambda: next(given))
    second = free_port(lambda: next(given))
    assert (first, second) == (41_001, 41_002)


def test_a_kernel_that_only_repeats_itself_is_an_error_not_a_hang() -> None:
    free_port(lambda: 41_003)
    with pytest.raises(ServiceFailed, match="no free TCP port"):
        free_port(lambda: 41_003)


def test_real_ports_are_distinct() -> None:
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
