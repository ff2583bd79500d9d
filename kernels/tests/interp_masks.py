"""Runs the plugin's tree-mask kernel (`_draft_mask.py`) on the CPU through Triton's interpreter
against its torch ops (pack_custom_mask), on random batches, and prints the number of batches checked. Started
by test_interpreter.py in a fresh process (TRITON_INTERPRET must be set before the kernels are
defined); on a GPU, test_verify_gpu.py makes the same checks with the compiled kernels.

    TRITON_INTERPRET=1 python interp_masks.py
"""
import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1"
here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.dirname(here))

import torch  # noqa: E402
from cases import random_custom_mask  # noqa: E402
from dflash_kernels import _draft_mask  # noqa: E402
from dflash_kernels.verify_attention import pack_custom_mask  # noqa: E402

checked = 0
for draft_lengths, prefixes in (([16], [0]), ([1, 16, 3], [5, 0, 200]), ([64, 33, 1, 40], [7, 1000, 0, 31]),
                                ([5] * 9, list(range(0, 90, 10)))):
    qo = torch.tensor([0, *torch.tensor(draft_lengths).cumsum(0).tolist()], dtype=torch.int32)
    kv = torch.tensor([0, *torch.tensor(prefixes).cumsum(0).tolist()], dtype=torch.int32)
    n_tok, mq = int(qo[-1]), max(draft_lengths)
    custom, mask_indptr = random_custom_mask(qo, kv)
    got = _draft_mask.tree_mask(custom, mask_indptr, qo, kv, n_tok, mq)
    assert torch.equal(got, pack_custom_mask(custom, mask_indptr, qo, kv, mq, num_tokens=n_tok)), draft_lengths
    checked += 1
print(checked)
