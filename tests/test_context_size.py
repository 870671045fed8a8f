"""The context serve and chat load given none (pickdraft.context): the models' training context where
memory allows, halved where it does not, never moving a layer off the GPU, at least 4,096.

Pure arithmetic over the memory plan, on the 7B and 0.5B shapes test_planner plans.
"""

from __future__ import annotations

import dataclasses

import pytest
from test_planner import DRAFT_05B, TARGET_7B

from localspec.pickdraft.context import AUTO_CTX_MIN, AUTO_CTX_SHARE, auto_context
from localspec.pickdraft.devices import GIB, DeviceMemory, apple, cpu_only, nvidia
from localspec.pickdraft.memplan import MemoryPlan, ModelShape, plan_memory


def trained(shape: ModelShape, n_ctx: int) -> ModelShape:
    return dataclasses.replace(shape, n_ctx_train=n_ctx)


def extra(device: DeviceMemory, n_ctx: int) -> tuple[int, MemoryPlan]:
    """What `n_ctx` takes on the host beyond AUTO_CTX_MIN (the 7B and the 0.5B), and the plan there."""
    floor = plan_memory(TARGET_7B, DRAFT_05B, device, n_ctx=AUTO_CTX_MIN)
    grown = plan_memory(TARGET_7B, DRAFT_05B, device, n_ctx=n_ctx)
    return grown.host_bytes - floor.host_bytes, floor


def test_a_roomy_machine_loads_the_training_context() -> None:
    assert auto_context(TARGET_7B, DRAFT_05B, cpu_only(64 * GIB)) == 32768
    assert auto_context(TARGET_7B, DRAFT_05B, nvidia(24 * GIB, 64 * GIB)) == 32768
    # A model trained for 128k on an 80 GB GPU gets all of it: its cache is within a quarter there.
    long = trained(TARGET_7B, 131072)
    assert auto_context(long, None, nvidia(80 * GIB, 128 * GIB)) == 131072
    # A context trained for a size that is no power of two is taken whole.
    assert auto_context(trained(TARGET_7B, 40960), None, cpu_only(64 * GIB)) == 40960


def test_a_draft_trained_for_less_does_not_bound_the_targets_context() -> None:
    assert auto_context(TARGET_7B, trained(DRAFT_05B, 16384), cpu_only(64 * GIB)) == 32768
    # It is the draft's cache at the target's context that is counted.
    device = cpu_only(18 * GIB)
    assert auto_context(TARGET_7B, DRAFT_05B, device) == 8192 < auto_context(TARGET_7B, None, device)


@pytest.mark.parametrize("ram_gib", [16, 24, 32])
def test_a_smaller_machine_gets_the_largest_size_within_a_quarter_of_what_is_free(ram_gib: int) -> None:
    device = cpu_only(ram_gib * GIB)
    n_ctx = auto_context(TARGET_7B, DRAFT_05B, device)
    assert AUTO_CTX_MIN < n_ctx < 32768
    host, floor = extra(device, n_ctx)
    free = floor.host_budget - floor.host_bytes
    assert host <= AUTO_CTX_SHARE * free
    # The next size up would take more than its share.
    more, _ = extra(device, 2 * n_ctx)
    assert more > AUTO_CTX_SHARE * free


def test_fast_loading_costs_context_a_second_cache_and_exact_loading_gets_more() -> None:
    """A repacked target reads prompts with a plain copy (its own KV cache and, past 8,192 positions
    on the CPU, plain attention's score rows): the same machine affords less context than with
    --exact, which has neither."""
    device = cpu_only(16 * GIB)
    fast = auto_context(TARGET_7B, DRAFT_05B, device)
    exact = auto_context(TARGET_7B, DRAFT_05B, device, repack=False)
    assert fast < exact


@pytest.mark.parametrize("ram_gib", [64, 256])
def test_a_context_takes_the_gpus_room_but_never_moves_a_layer_off_it(ram_gib: int) -> None:
    device = nvidia(8 * GIB, ram_gib * GIB)
    floor = plan_memory(TARGET_7B, DRAFT_05B, device, n_ctx=AUTO_CTX_MIN)
    assert floor.target.all_on_gpu and AUTO_CTX_MIN < floor.max_n_ctx < 32768
    # The training context would put 3 of the 7B's layers on the host, where RAM would hold them.
    assert not plan_memory(TARGET_7B, DRAFT_05B, device, n_ctx=32768).target.all_on_gpu
    n_ctx = auto_context(TARGET_7B, DRAFT_05B, device)
    assert n_ctx == 16384 < floor.max_n_ctx  # the largest size there: VRAM left free is the models' own
    grown = plan_memory(TARGET_7B, DRAFT_05B, device, n_ctx=n_ctx)
    assert grown.target.all_on_gpu and grown.draft is not None and grown.draft.all_on_gpu


def test_unified_memory_counts_the_gpus_share_against_ram() -> None:
    small, large = apple(16 * GIB), apple(64 * GIB)
    assert AUTO_CTX_MIN <= auto_context(TARGET_7B, DRAFT_05B, small) < 32768
    assert auto_context(TARGET_7B, DRAFT_05B, large) == 32768


def test_never_below_4096_even_where_the_model_was_trained_for_less_or_nothing_fits() -> None:
    assert auto_context(trained(TARGET_7B, 2048), None, cpu_only(64 * GIB)) == AUTO_CTX_MIN
    assert auto_context(trained(TARGET_7B, 0), None, cpu_only(64 * GIB)) == AUTO_CTX_MIN
    # Too small for the models at all: the load refuses them, at the context it always had.
    assert auto_context(TARGET_7B, DRAFT_05B, cpu_only(2 * GIB)) == AUTO_CTX_MIN
