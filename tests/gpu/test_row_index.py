"""``row_index``: rows given flat in any order read the same rows as the ``[B, N, V]`` layout."""
import pytest
import torch

from gpu import expected_accepted_length, verify

from .test_exact import random_batch
from .helpers import padded_rows


@pytest.mark.parametrize("method, process", [("nss", "topk"), ("rrs", "iid"), ("tv", "wor"), ("univer", "iid")])
def test_flat_rows_in_any_order_give_the_same_verification(method, process):
    model, trees = random_batch(process, 5, seed=4, count=9)
    batch, p, q = padded_rows(trees, model)
    B, N, V = p.shape
    perm = torch.randperm(B * N, generator=torch.Generator().manual_seed(0))
    row_index = torch.empty(B * N, dtype=torch.long).scatter_(0, perm, torch.arange(B * N)).view(B, N)
    p_flat, q_flat = p.reshape(-1, V)[perm], q.reshape(-1, V)[perm]
    assert torch.equal(p_flat[row_index], p)
    want = verify(batch, p, q, process, method, torch.Generator().manual_seed(1))
    got = verify(batch, p_flat, q_flat, process, method, torch.Generator().manual_seed(1), row_index=row_index)
    for a, b in zip((want.accepted_nodes, want.num_accepted, want.next_token),
                    (got.accepted_nodes, got.num_accepted, got.next_token)):
        assert torch.equal(a, b)
    torch.testing.assert_close(expected_accepted_length(batch, p_flat, q_flat, process, method, row_index=row_index),
                               expected_accepted_length(batch, p, q, process, method), rtol=0, atol=1e-12)


def test_row_index_inputs_are_checked():
    model, trees = random_batch("iid", 3, seed=1, count=2)
    batch, p, q = padded_rows(trees, model)
    B, N, V = p.shape
    rows = torch.arange(B * N).view(B, N)
    for bad in (99, B * N):                             # far out, and the first id past the R = B·N rows
        with pytest.raises(ValueError, match=rf"row_index\[0, 1\] = {bad} is outside"):
            verify(batch, p.reshape(-1, V), q.reshape(-1, V), "iid", "tv",
                   row_index=rows.index_put((torch.tensor([0]), torch.tensor([1])), torch.tensor(bad)))
    with pytest.raises(ValueError, match="must be \\[R, V\\] rows"):
        verify(batch, p, q, "iid", "tv", row_index=rows)
    with pytest.raises(ValueError, match="row_index must be a long tensor"):
        verify(batch, p.reshape(-1, V), q.reshape(-1, V), "iid", "tv", row_index=rows.int())
