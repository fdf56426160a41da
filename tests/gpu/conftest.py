"""gpu tests run torch on one intra-op thread: their tensors are small or medium (≤ 10⁷ elements), where
thread hand-off on a loaded 2-core machine costs more than it saves (measured ~10× slower with 2 threads)."""
import torch

torch.set_num_threads(1)
