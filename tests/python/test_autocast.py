# SPDX-License-Identifier: BSD-3-Clause
"""lucid_amp.autocast over torch.autocast: context manager, decorator, nesting, arguments."""

import pytest
import torch

import lucid_amp


def test_cpu_bfloat16_region_runs_the_forward_in_bfloat16_and_keeps_float32_parameters():
    lin = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with lucid_amp.autocast("cpu", dtype=torch.bfloat16):
        assert lucid_amp.is_autocast_enabled("cpu")
        y = lin(x)
    assert y.dtype == torch.bfloat16
    assert lin.weight.dtype == torch.float32
    assert not lucid_amp.is_autocast_enabled("cpu")
    assert lin(x).dtype == torch.float32


def test_nested_regions_restore_what_they_found():
    lin = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with lucid_amp.autocast("cpu", dtype=torch.bfloat16):
        with lucid_amp.autocast("cpu", enabled=False):
            assert not lucid_amp.is_autocast_enabled("cpu")
            assert lin(x).dtype == torch.float32
        assert lucid_amp.is_autocast_enabled("cpu")
        assert lin(x).dtype == torch.bfloat16


def test_decorator_and_reuse_of_one_object():
    region = lucid_amp.autocast("cpu", dtype=torch.bfloat16)
    lin = torch.nn.Linear(4, 4)

    @region
    def forward(x):
        return lin(x)

    assert forward(torch.randn(1, 4)).dtype == torch.bfloat16
    with region:
        with region:  # one object, entered twice
            assert lin(torch.randn(1, 4)).dtype == torch.bfloat16
        assert lucid_amp.is_autocast_enabled("cpu")
    assert not lucid_amp.is_autocast_enabled("cpu")


def test_an_exception_leaves_the_region():
    with pytest.raises(KeyError):
        with lucid_amp.autocast("cpu", dtype=torch.bfloat16):
            raise KeyError("x")
    assert not lucid_amp.is_autocast_enabled("cpu")


def test_bad_arguments_raise_value_error():
    with pytest.raises(ValueError):
        lucid_amp.autocast("cpu", dtype=torch.int32)
    with pytest.raises(ValueError):
        lucid_amp.autocast(3)
    with pytest.raises(ValueError):
        lucid_amp.is_autocast_enabled("tpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_float16_region():
    lin = torch.nn.Linear(4, 4).cuda()
    with lucid_amp.autocast("cuda"):
        assert lin(torch.randn(2, 4, device="cuda")).dtype == torch.float16
