"""Engine-adapter tests run torch on one intra-op thread (small tensors, a shared 2-core machine)."""
import torch

torch.set_num_threads(1)
