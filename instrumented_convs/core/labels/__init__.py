"""Names a step shows to other tools: NVTX ranges for Nsight Systems (nvtx) and
torch.profiler labels (profiler)."""
