"""A worker that reports where it runs, for the tests of each Ray rank's GPU (`test_ray_gpus.py`) and of
what a rank inherits from the driver (`test_ray_backend.py`)."""

import os

import torch

from hflow.engine.groups.dispatch import Dispatch, register
from hflow.engine.groups.worker import Worker


class DeviceWorker(Worker):
    def __init__(self, rank: int = 0, world_size: int = 1, device: str = "cpu"):
        super().__init__(rank, world_size)
        self.device = device

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def where(self) -> dict:
        """This rank's device, the current CUDA device, its GPU's UUID (one per physical GPU), and the
        run's choice of CPU product kernels and of its compiled kernels as the rank sees them."""
        cuda = torch.device(self.device).type == "cuda"
        return {"device": self.device, "current": torch.cuda.current_device() if cuda else None,
                "uuid": str(torch.cuda.get_device_properties(self.device).uuid) if cuda else None,
                "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "products": os.environ.get("HFLOW_CPU_PRODUCTS"),
                "kernels": os.environ.get("HFLOW_CPU_KERNELS")}
