"""The device a rank trains on: a GPU topology where torch sees no GPU, or a local rank past the GPU
count, is one clear error (DeviceError, exit 2), not a CUDA traceback; and the clocks' device wait
is a no-op on CPU and torch.cuda.synchronize of the rank's GPU on CUDA."""

from __future__ import annotations

import functools

import pytest
import torch

from dlrm.common.errors import user_error_message
from dlrm.distributed.topology import DeviceError, NoGPUForRankError, device_for, synchronizer
from dlrm.distributed.world import World


def test_a_gpu_topology_without_a_gpu_is_one_line_printed_once(make_config, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceError, match="topology=dgx_h100 wants device=cuda but torch sees no GPU") as e:
        device_for(make_config("topology=dgx_h100").topology, World())
    assert user_error_message(e.value, 0).startswith("error: topology=dgx_h100")
    assert user_error_message(e.value, 5) is None  # every rank meets it: rank 0 alone prints it


@pytest.mark.parametrize(
    "cuda, init_error, words",
    [
        (None, None, ["CPU-only build", "topology=cpu"]),
        (
            "13.0",
            "The NVIDIA driver on your system is too old (found version 12040). Please update",
            ["too old (found version 12040)", "CUDA 13.0", ">= 580", "CUDA_VERSION=12.8"],
        ),
        ("13.0", "Found no NVIDIA driver on your system. Please check", ["Found no NVIDIA driver", "nvidia-smi"]),
        ("13.0", None, ["reports no device", "CUDA_VISIBLE_DEVICES"]),
    ],
)  # fmt: skip
def test_no_gpu_says_why(make_config, monkeypatch, cuda, init_error, words):
    """The reason is the build (CPU-only torch) or CUDA's own (no driver, a driver too old), with its fix."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(torch.version, "hip", None)

    def init():
        if init_error is not None:
            raise RuntimeError(init_error)

    monkeypatch.setattr(torch.cuda, "init", init)
    with pytest.raises(DeviceError) as e:
        device_for(make_config("topology=dgx_h100").topology, World())
    message = user_error_message(e.value, 0)
    assert message is not None and message.count("\n") == 0, message
    assert all(w in message for w in words), message


def test_a_local_rank_past_the_gpu_count_names_itself(make_config, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    with pytest.raises(NoGPUForRankError, match="local rank 5 has no GPU: torch sees 4") as e:
        device_for(
            make_config("topology=dgx_h100").topology, World(rank=5, world_size=8, local_rank=5, local_world_size=8)
        )
    assert user_error_message(e.value, 5).startswith("error: [rank 5] local rank 5")


def test_the_device_wait(monkeypatch):
    synchronizer(torch.device("cpu"))()  # nothing to wait for
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waited.append(device))
    sync = synchronizer(torch.device("cuda", 3))
    assert isinstance(sync, functools.partial)
    sync()
    assert waited == [torch.device("cuda", 3)]


@pytest.mark.parametrize("device", ["cpu", "cuda:1"])
def test_the_process_group_gets_the_collective_timeout_and_the_gpu(make_config, monkeypatch, device):
    """trainer.collective_timeout_s reaches init_process_group as its timeout; on a GPU the rank's device
    is bound at init (device_id), on CPU none is."""
    from datetime import timedelta

    import torch.distributed as dist

    from dlrm.distributed import topology

    seen = {}
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: seen.update(kw))
    monkeypatch.setattr(dist, "group", type("G", (), {"WORLD": "world"}))
    cfg = make_config("trainer.collective_timeout_s=42.5")
    topology.init_distributed(cfg.topology, World(), torch.device(device), cfg.trainer.collective_timeout_s)
    assert seen["timeout"] == timedelta(seconds=42.5)
    assert seen["device_id"] == (torch.device(device) if device != "cpu" else None)
    with pytest.raises(Exception, match="collective_timeout_s"):
        make_config("trainer.collective_timeout_s=0").trainer.check()


@pytest.mark.parametrize(
    "message, words",
    [  # Gloo's words (torch 2.13): the rank that waited, a pair closed by a timeout, the peer left behind
        ("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation to complete", "5 s"),
        ("Application timeout caused pair closure", "5 s"),
        ("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:2451", "lost the connection"),
    ],
)
def test_collective_failures_are_one_line(message, words, monkeypatch):
    from dlrm.distributed.topology import collective_failure

    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "1")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")  # torchrun restarts it: said so
    failure = collective_failure(RuntimeError(message), 5.0)
    assert failure is not None and "torchrun restarts the job (restart 1 of --max-restarts=1)" in str(failure)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # no restart left: the user continues it
    failure = collective_failure(RuntimeError(message), 5.0)
    assert failure is not None and words in str(failure) and "trainer.resume=auto" in str(failure)
    assert failure.exit_code == 3 and "\n" not in str(failure)
    assert collective_failure(RuntimeError("CUDA out of memory"), 5.0) is None  # anything else keeps its traceback
    assert collective_failure(ValueError(message), 5.0) is None
